"""``memgym eval``, ``memgym synth qa|trajectories`` and ``memgym annotate`` on real vLLM.

eval: SmolLM2 builds memory over conv-30's first session and answers 4 of its questions, free and
constrained to the managers' schemas, once through the in-process ``vllm:`` backend
(:func:`memgym.evolution.evaluation.eval_job.run_eval` with the session's engine registered for the spec)
and once through ``memgym eval`` with ``openai:`` specs against the server: the two reports
agree score for score and prediction for prediction, and the constrained column has 0 format
failures. synth / annotate: the CLI against the served SmolLM2 (1 session, 2 questions per
conversation), no response cache, so every reply comes from vLLM."""
from __future__ import annotations

import json
import re

import pytest

from tests.vllm.test_serve import memgym

pytestmark = pytest.mark.vllm

EVAL = ["--dataset", "locomo", "--conversations", "conv-30", "--n_sessions", "1", "--max_questions", "4",
        "--scorer", "f1", "--extractor_max_new_tokens", "192", "--answer_max_new_tokens", "24",
        "--constrained_max_chars", "80", "--constrained_max_items", "2", "--cache", "none", "--stage_cache", "none",
        "--batch_size", "8", "--no_progress"]


def _columns(report: dict) -> list[dict]:
    cols = [report, *report["compare"].values()]
    keys = ("n", "overall", "overall_recall", "by_category", "by_capability", "format_failure_rate",
            "format_failures_by_type", "tokens")
    return [{k: c[k] for k in keys} for c in cols]


def test_eval_in_process_and_served_give_the_same_report(vllm_base, vllm_server, tmp_path):
    from memgym.evolution.evaluation.eval_job import EvalConfig, run_eval
    from memgym.llm.runtime import Runtime

    served = vllm_server.spec(vllm_server.base_model)
    r = memgym("eval", *EVAL, "--extractor", served, "--compare", f"{served} constrained", "--task_model", served,
               "--out", str(tmp_path / "served"), timeout=1800)
    assert r.returncode == 0, r.stderr[-3000:]
    remote = json.loads((tmp_path / "served" / "report.json").read_text())

    local_spec = vllm_base.model_id.split("@")[0]  # vllm:<SmolLM2 dir>
    cfg = EvalConfig(dataset="locomo", conversations=["conv-30"], n_sessions=1, max_questions=4, scorer="f1",
                     extractor=local_spec, compare=[f"{local_spec} constrained"], task_model=local_spec,
                     extractor_max_new_tokens=192, answer_max_new_tokens=24, constrained_max_chars=80,
                     constrained_max_items=2, cache="none", stage_cache="none", batch_size=8, progress=False,
                     out=str(tmp_path / "local"))
    rt = Runtime(cache=None, batch_size=8)
    rt.register(local_spec, vllm_base)
    local = run_eval(cfg, rt)
    assert vllm_base.calls > 0 and rt.calls["task"] > 0

    assert _columns(local) == _columns(remote)
    assert local["n"] == 4
    constrained = next(iter(local["compare"].values()))
    assert set(constrained["format_failure_rate"].values()) == {0.0}, constrained["format_failure_rate"]
    assert not constrained["format_failures_by_type"]
    preds = [sorted((json.loads(x)["id"], json.loads(x)["prediction"]) for x in
                    (tmp_path / d / "predictions.jsonl").read_text().splitlines()) for d in ("local", "served")]
    assert preds[0] == preds[1] and len(preds[0]) == 8


def test_synth_qa_trajectories_and_annotate_against_the_server(vllm_server, tmp_path):
    """SmolLM2 is no expert: what it writes is mostly rejected. The point is that every command
    runs on the served model's replies and accounts for each of them."""
    spec = vllm_server.spec(vllm_server.base_model)
    common = ["--conversations", "conv-26", "--n-sessions", "1", "--expert", spec, "--cache", "none", "--quiet",
              "--max-tries", "2", "--embedder", "hash:64", "--constrained", "true"]
    qa = tmp_path / "qa.jsonl"
    r = memgym("synth", "qa", *common, "--j", "2", "--max-new-tokens", "400", "--out", str(qa), timeout=1800)
    s = json.loads((tmp_path / "qa.jsonl.summary.json").read_text())
    print("synth qa:", r.returncode, json.dumps(s))
    assert r.returncode in (0, 1) and s["runtime"]["calls"]["expert"] == s["model_calls"] == s["attempts"] >= 1
    assert s["rejected"]["unparsable"] == 0  # constrained: every reply parses
    assert s["accepted"] + s["rejected_total"] == s["generated_items"] >= 1  # each item judged
    assert s["sessions_written"] == 1 and len(qa.read_text().splitlines()) == 1

    traj = tmp_path / "traj.jsonl"
    r = memgym("synth", "trajectories", *common, "--max-new-tokens", "300", "--out", str(traj), timeout=1800)
    s = json.loads((tmp_path / "traj.jsonl.summary.json").read_text())
    print("synth trajectories:", r.returncode, json.dumps(s))
    assert s["runtime"]["calls"]["expert"] == s["model_calls"] >= 4  # the four managers of session 1, retries
    assert s["sessions_written"] + len(s["failed"]) == 1 and r.returncode == (1 if s["failed"] else 0)

    labels = tmp_path / "labels.jsonl"
    r = memgym("annotate", "--dataset", "locomo", "--split", "train", "--annotator", spec, "--out", str(labels),
               "--max_questions", "2", "--max_retries", "2", "--cache", "none", timeout=1800)
    print("annotate:", r.returncode, r.stdout[-1500:], r.stderr[-1500:])
    m = re.search(r"annotator calls this run (\d+) \((\d+) replies from the response cache\)", r.stdout)
    assert m, r.stdout[-2000:]
    calls, cached = int(m[1]), int(m[2])
    assert cached == 0 and 4 <= calls <= 12  # conv-26 and conv-30, 2 questions each, up to 1 + 2 retries
    saved = len(labels.read_text().splitlines()) if labels.exists() else 0
    if saved < 4:  # replies that fail validation are not saved, and the command says so in one line
        assert r.returncode == 1 and f"{4 - saved} of 4 questions got no valid annotator label" in r.stderr
    else:
        assert r.returncode == 0
