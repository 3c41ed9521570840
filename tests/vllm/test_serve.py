"""``memgym serve --engine vllm`` and the two vLLM backends on real vLLM: the server answers
/health and lists SmolLM2 and the LoRA adapter; a taken port or a wrong model dir is one stderr
line before vLLM starts; the in-process ``vllm:`` backend (``LLM.chat``) and the ``openai:``
backend against the server give the same greedy outputs, for the base model and the adapter, and
``memgym eval`` over each gives the same report; SIGTERM stops the server and its engine."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.request

import pytest

from memgym.llm.base import GenerationParams
from tests.vllm.conftest import REPO, tail

pytestmark = pytest.mark.vllm

PROMPTS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You answer in one short sentence."},
     {"role": "user", "content": "Why is the sky blue?"}],
    [{"role": "user", "content": "List three fruits."}],
    [{"role": "user", "content": "Gina: I opened my online clothing store last week.\nJon: Congrats!\n\n"
                                 "What did Gina open?"}],
]
GREEDY = GenerationParams(max_new_tokens=40, temperature=0)


def memgym(*argv, timeout=300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "memgym.launch.cli", *argv], capture_output=True, text=True,
                          timeout=timeout, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


def test_server_is_healthy_and_serves_the_base_and_the_adapter(vllm_server):
    root = vllm_server.base_url.removesuffix("/v1")
    with urllib.request.urlopen(f"{root}/health", timeout=10) as r:
        assert r.status == 200
    with urllib.request.urlopen(f"{vllm_server.base_url}/models", timeout=10) as r:
        ids = {m["id"] for m in json.load(r)["data"]}
    assert ids == {vllm_server.base_model, vllm_server.lora_model}
    assert vllm_server.ready == {"base_url": vllm_server.base_url, "model": "tiny-lora", "role": "policy",
                                 "engine": "vllm"}


def test_a_taken_port_is_one_line_before_vllm_starts(vllm_server, smollm2_dir):
    port = vllm_server.base_url.rsplit(":", 1)[1].split("/")[0]
    r = memgym("serve", "--model", f"vllm:{smollm2_dir}", "--engine", "vllm", "--port", port)
    assert r.returncode == 1, r.stderr
    assert r.stderr.strip() == (f"memgym serve: [Errno 98] cannot listen on 127.0.0.1:{port} (Address already in "
                                "use); pick another --port (0 = any free port) or --host")
    assert "api_server" not in r.stdout and "api_server" not in r.stderr  # vLLM never started


@pytest.mark.parametrize("kind", ["missing", "not a model"])
def test_a_wrong_model_dir_is_one_line(tmp_path, kind):
    d = tmp_path / "m"
    if kind == "not a model":
        d.mkdir()
        (d / "notes.txt").write_text("x")
    r = memgym("serve", "--model", f"vllm:{d}", "--engine", "vllm", "--port", "0")
    assert r.returncode == 1 and len(r.stderr.strip().splitlines()) == 1, r.stderr
    want = (f"is not a directory" if kind == "missing" else
            f"{d} is not a model dir: it has neither config.json nor adapter_config.json")
    assert want in r.stderr and "api_server" not in r.stdout


def test_in_process_and_served_greedy_outputs_are_the_same(vllm_server, vllm_engine, vllm_base):
    from memgym.llm.openai_backend import OpenAIBackend

    for local, model in ((vllm_base, vllm_server.base_model), (vllm_engine, vllm_server.lora_model)):
        served = OpenAIBackend(vllm_server.base_url, model, max_concurrency=4)
        a, b = local.generate(PROMPTS, GREEDY), served.generate(PROMPTS, GREEDY)
        assert [c.text for c in a] == [c.text for c in b], model
        assert [(c.prompt_tokens, c.completion_tokens) for c in a] == [(c.prompt_tokens, c.completion_tokens)
                                                                      for c in b]
        assert all(c.text.strip() for c in a)
    base = [c.text for c in vllm_base.generate(PROMPTS, GREEDY)]
    lora = [c.text for c in vllm_engine.generate(PROMPTS, GREEDY)]
    assert sum(x != y for x, y in zip(base, lora)) >= 3  # the adapter is applied, in both places
    assert "Paris" in base[0]


@pytest.mark.vllm_last
def test_sigterm_stops_the_server_and_its_engine(vllm_server):
    import psutil

    children = psutil.Process(vllm_server.proc.pid).children(recursive=True)
    assert children  # vLLM's API server and its engine core
    rc, seconds = vllm_server.stop()
    assert rc == 0 and seconds < 90, tail(vllm_server.log)
    time.sleep(2)
    assert not [c for c in children if c.is_running() and c.status() != psutil.STATUS_ZOMBIE]
    port = int(vllm_server.base_url.rsplit(":", 1)[1].split("/")[0])
    from memgym.launch.cmd_serve import check_port

    assert check_port("127.0.0.1", port) == port  # the port is free again
