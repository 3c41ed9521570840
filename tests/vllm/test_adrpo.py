"""ADRPO (TRL GRPOTrainer subclass) with ``use_vllm: true`` on vLLM's CPU build, two steps of
SmolLM2 each (tests/vllm/adrpo_run.py, one process per mode).

colocate: every rollout comes from TRL's in-process vLLM engine (the policy's own ``generate``
never runs), and the weights reach vLLM before each step (on vLLM's CPU build through
:func:`memgym.training.adrpo_trainer.reload_colocated_weights`, since TRL's own ``sync_weights`` fails
there with AttributeError: 'Parameter' object has no attribute 'weight_loader'): at each step's end vLLM holds exactly
the weights the policy had when the step began (rounded to vLLM's dtype), the policy moved
between steps, and after the last sync vLLM's log-probability of a fixed completion has changed.

server: against the shared ``memgym serve --weight-sync`` server, on CPU TRL's trainer stops in
``VLLMClient.init_communicator`` (trl/generation/vllm_client.py), called by
``VLLMGeneration._init_vllm`` when the trainer is built: the weight transfer is vLLM's NCCL
engine, which needs a CUDA device, and the trainer's device here is the CPU. Everything before it
runs: the client reaches the server, reads its world size and dev-mode configuration, and the
server generates rollouts through TRL's client. On a GPU the same test trains two steps and
requires the served greedy completion's log-probability to change.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.vllm.conftest import REPO

pytestmark = pytest.mark.vllm


CUDA = __import__("torch").cuda.is_available()


def run(mode: str, model, out, *extra, timeout=2400) -> dict:
    # VLLM_CPU_CI_ENV=1: TRL builds its colocate engine without enforce_eager, and on the CPU platform
    # vLLM then compiles the model with inductor (minutes on 2 cores); this switch of vLLM's own CPU CI
    # keeps the dynamo trace on the eager backend (vllm/platforms/cpu.py, check_and_update_config).
    # The CPU platform alone reads it.
    r = subprocess.run([sys.executable, "-m", "tests.vllm.adrpo_run", mode, str(model), str(out), *extra],
                       capture_output=True, text=True, timeout=timeout, cwd=REPO,
                       env={**os.environ, "PYTHONPATH": str(REPO), "VLLM_CPU_CI_ENV": "1"})
    lines = [x for x in r.stdout.splitlines() if x.startswith("ADRPO_RESULT ")]
    assert r.returncode == 0 and lines, (r.stdout[-3000:], r.stderr[-5000:])
    return json.loads(lines[-1].split(" ", 1)[1])


def test_adrpo_colocate_rollouts_from_vllm_and_weights_reach_it(smollm2_dir, tmp_path):
    res = run("colocate", smollm2_dir, tmp_path / "out")
    print("colocate:", json.dumps(res))
    assert res["steps"] == 2
    assert res["calls"] == {"vllm": 2, "completions": 4, "hf": 0}  # 1 prompt x 2 generations per step
    assert res["vllm_equals_policy_at_step_begin"] == [True, True]
    assert len(res["policy_moved_between_steps"]) == 1 and res["policy_moved_between_steps"][0] > 0
    assert res["vllm_equals_final_policy_after_sync"] and res["vllm_changed_since_step_0"]
    assert res["logprob_before"] != res["logprob_after"]
    assert res["trl_sync_error"] == (None if CUDA else "'Parameter' object has no attribute 'weight_loader'")


def test_adrpo_server_mode_stops_at_trls_nccl_weight_sync(vllm_server, smollm2_dir, tmp_path):
    from trl.generation.vllm_client import VLLMClient

    root = vllm_server.base_url.removesuffix("/v1")
    client = VLLMClient(base_url=root, connection_timeout=30)
    assert client.get_world_size() == 1
    assert client.get_server_info()["model_config"]["logprobs_mode"] == "processed_logprobs"
    out = client.generate(["Gina opened a store. Memory:"], n=2, max_tokens=8, temperature=1.0)
    assert len(out["completion_ids"]) == 2 and all(len(c) == 8 for c in out["completion_ids"])

    res = run("server", vllm_server.base_model, tmp_path / "out", root)
    if CUDA:  # a GPU: the NCCL weight sync runs, and the served policy changes
        assert res["error"] is None and res["steps"] == 2, res
        assert res["logprob_before"] != res["logprob_after"]
        return
    assert res["error"] == "NotImplementedError", res
    assert res["message"] == ("Weight synchronization runs on vLLM's NCCL weight-transfer engine, which needs a CUDA "
                              "device, got 'cpu'. Generation through the server is unaffected.")
    assert res["frames"][-1] == "trl/generation/vllm_client.py:init_communicator"
    assert res["frames"][-2] == "trl/generation/vllm_generation.py:_init_vllm"
