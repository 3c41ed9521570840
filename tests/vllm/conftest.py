"""Fixtures of the vllm lane (tests marked ``vllm``, ``make test-vllm``): real vLLM on the embedded
SmolLM2-135M-Instruct, started once per session because each start costs minutes on a 2-core CPU.

- ``lora_dir``: a PEFT LoRA on SmolLM2 (r 8, q/k/v/o projections) with seeded random A *and* B
  (``init_lora_weights=False``; PEFT's default B = 0 would leave the outputs unchanged).
- ``vllm_server``: ``memgym serve --model vllm:<lora_dir> --engine vllm --weight-sync`` as a child
  process: vLLM's OpenAI server with SmolLM2 served as ``base_model`` and the adapter as
  ``lora_model``, plus TRL's weight-sync endpoints. ``stop()`` sends SIGTERM and returns
  ``(exit status, seconds)``; its log is ``log`` (shown on failure).
- ``vllm_engine``: the in-process ``vllm:<lora_dir>`` backend (:class:`memgym.llm.vllm_backend.VLLMBackend`,
  ``LLM.chat``), with the server's engine settings; ``vllm_base`` is the same engine without the
  adapter (no LoRA request).

Each engine gets a 1 GiB KV cache (``VLLM_CPU_KVCACHE_SPACE``, set here unless given) and
:data:`ENGINE_ARGS`; on vLLM's CPU build both run eager in float32
(:data:`memgym.llm.vllm_backend.CPU_ENGINE_DEFAULTS`).
"""
from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
#: The engine settings of the server and the in-process engine (identical, so greedy outputs match).
ENGINE_ARGS = {"max_model_len": 4096, "max_num_seqs": 32}
if __import__("torch").cuda.is_available():  # the server, this engine and TRL's colocate engine share one GPU
    ENGINE_ARGS["gpu_memory_utilization"] = 0.2
STARTUP_TIMEOUT_S = 1500


def flags(kw: dict) -> list[str]:
    """``ENGINE_ARGS`` as vLLM command-line flags."""
    return [x for k, v in kw.items() for x in (f"--{k.replace('_', '-')}", str(v))]


@pytest.fixture(scope="session")
def lora_dir(smollm2_dir, tmp_path_factory) -> Path:
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    out = tmp_path_factory.mktemp("lora") / "tiny-lora"
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = AutoModelForCausalLM.from_pretrained(str(smollm2_dir), dtype=torch.float32)
        cfg = LoraConfig(r=8, lora_alpha=16, lora_dropout=0.0, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                         init_lora_weights=False, task_type="CAUSAL_LM")
        peft = get_peft_model(model, cfg)
    peft.save_pretrained(str(out))
    cfg = json.loads((out / "adapter_config.json").read_text())
    assert cfg["base_model_name_or_path"] == str(smollm2_dir)
    return out


@dataclass
class Server:
    """A running ``memgym serve`` (see the module docstring)."""

    proc: subprocess.Popen
    log: Path
    ready: dict = field(default_factory=dict)
    base_model: str = ""
    lora_model: str = ""
    started_s: float = 0.0

    @property
    def base_url(self) -> str:
        return self.ready["base_url"]

    def spec(self, model: str) -> str:
        return f"openai:{self.base_url}#{model}"

    def stop(self, timeout: float = 120) -> tuple[int, float]:
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout)
        return rc, time.monotonic() - t0


def start_serve(argv: list[str], log: Path, timeout_s: float = STARTUP_TIMEOUT_S) -> Server:
    """Run ``memgym serve ARGV`` (this venv's Python), copy its output to ``log`` and wait for its
    JSON ready line; pytest.fail with the log's tail when it exits first or times out."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    t0 = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "memgym.launch.cli", "serve", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO)
    server, got = Server(proc, log), threading.Event()

    def pump():
        with open(log, "w") as f:
            for line in proc.stdout:
                f.write(line)
                f.flush()
                if line.startswith("{") and '"base_url"' in line:
                    server.ready = json.loads(line)
                    got.set()

    threading.Thread(target=pump, daemon=True).start()
    while not got.wait(1.0):
        if proc.poll() is not None or time.monotonic() - t0 > timeout_s:
            proc.kill()
            pytest.fail(f"memgym serve did not become ready (exit {proc.poll()}):\n{tail(log)}")
    server.started_s = time.monotonic() - t0
    return server


def tail(path: Path, n: int = 40) -> str:
    lines = [x for x in Path(path).read_text(errors="replace").splitlines() if "Attempted to load weight" not in x]
    return "\n".join(lines[-n:])


@pytest.fixture(scope="session")
def vllm_server(lora_dir, smollm2_dir, tmp_path_factory):
    log = tmp_path_factory.mktemp("serve") / "serve.log"
    server = start_serve(["--model", f"vllm:{lora_dir}", "--engine", "vllm", "--port", "0", "--weight-sync",
                          "--", *flags(ENGINE_ARGS)], log)
    server.base_model, server.lora_model = str(smollm2_dir.resolve()), lora_dir.name
    print(f"\nvLLM server ready in {server.started_s:.0f} s at {server.base_url}", file=sys.stderr)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def vllm_engine(lora_dir):
    from memgym.llm.vllm_backend import VLLMBackend

    t0 = time.monotonic()
    engine = VLLMBackend(lora_dir, **ENGINE_ARGS)
    print(f"\nin-process vLLM engine ready in {time.monotonic() - t0:.0f} s", file=sys.stderr)
    return engine


@pytest.fixture(scope="session")
def vllm_base(vllm_engine, smollm2_dir):
    """The in-process engine without the adapter: SmolLM2 itself (model id ``vllm:<dir>``)."""
    from memgym.llm.paths import dir_fingerprint

    base = copy.copy(vllm_engine)
    base.lora_request = None
    base.model_id = f"vllm:{smollm2_dir.resolve()}@{dir_fingerprint(smollm2_dir)}"
    return base


def pytest_configure(config):
    config.addinivalue_line("markers", "vllm_last: runs after every other vllm test (it stops the shared server)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    items.sort(key=lambda item: item.get_closest_marker("vllm_last") is not None)
