"""d_ext / d_idx / d_ret: hand-made and hand-computed cases, evidence mapping through turn ids."""
from __future__ import annotations

import json

import numpy as np
import pytest

from memgym.evolution.execution.diagnostics import (DiagTask, EvidenceTrace, diagnose_run, diagnose_tasks, max_match,
                                             split_segments)
from memgym.evolution.execution.runner import ProgramRunner, RunnerSettings
from memgym.llm.embeddings import HashEmbedder
from memgym.llm.runtime import Runtime
from memgym.memory_bank.programs import read_program_source, seed_program_path
from tests.helpers import TASK, Script, ScriptedBackend, conversation


class Lookup:
    """An embedder with hand-set vectors (rows normalised), for hand-computed cosines."""

    def __init__(self, table):
        self.table = {k: np.asarray(v, np.float32) / np.linalg.norm(v) for k, v in table.items()}

    def encode(self, texts):
        return np.stack([self.table[t] for t in texts]) if texts else np.zeros((0, 3), np.float32)


def test_verbatim_evidence_in_one_unit_gives_d_ext_one():
    e = "Caroline went to the LGBTQ support group on 7 May 2023"
    task = DiagTask("t1", "F", [EvidenceTrace(e, ["Melanie painted a lake", e, "unrelated words here"])], "")
    rep = diagnose_tasks([task], HashEmbedder(dim=256))
    assert rep["tasks"][0]["d_ext"] == pytest.approx(1.0, abs=1e-6)
    assert rep["overall"]["d_ret"] == 0.0  # nothing retrieved: m(e, {}) = 0
    assert rep["overall"]["d_idx"] is None  # no probe measured


def test_hand_computed_d_ret_d_idx_and_capability_means():
    emb = Lookup({"e1": [1, 0, 0], "e2": [0, 0, 1], "a": [0.6, 0.8, 0], "b": [0, 1, 0], "c": [0, 0.6, 0.8],
                  "u": [0.8, 0, 0.6]})
    t1 = DiagTask("t1", "F", [EvidenceTrace("e1", ["u"], probe="b"), EvidenceTrace("e2", ["u"], probe="c\nb")],
                  retrieved="a\n\n  b  \n")
    t2 = DiagTask("t2", "F", [EvidenceTrace("e2", [], probe="c")], retrieved="c")
    t3 = DiagTask("t3", "T", [], retrieved="a")  # no resolvable evidence
    rep = diagnose_tasks([t1, t2, t3], emb)
    r1, r2 = rep["tasks"][0], rep["tasks"][1]
    # t1: d_ret = mean(max(cos(e1,a)=.6, cos(e1,b)=0), max(cos(e2,a)=0, cos(e2,b)=0)) = 0.3
    assert r1["d_ret"] == pytest.approx(0.3)
    assert r1["d_ext"] == pytest.approx((0.8 + 0.6) / 2)  # cos(e1,u)=.8, cos(e2,u)=.6
    assert r1["d_idx"] == pytest.approx((0.0 + 0.8) / 2)  # e1 vs {b}=0; e2 vs {c,b}=.8
    assert (r2["d_ret"], r2["d_ext"], r2["d_idx"]) == (pytest.approx(0.8), 0.0, pytest.approx(0.8))
    assert rep["by_capability"]["F"]["d_ret"] == pytest.approx((0.3 + 0.8) / 2)
    assert rep["by_capability"]["F"]["n"] == 2 and "T" not in rep["by_capability"]
    assert rep["n_no_evidence"] == 1 and rep["tasks"][2]["d_ret"] is None
    assert rep["overall"]["d_ext"] == pytest.approx((0.7 + 0.0) / 2)


def test_max_match_and_segments():
    assert max_match(np.array([1.0, 0.0], np.float32), np.zeros((0, 2), np.float32)) == 0.0
    assert max_match(np.array([1.0, 0.0], np.float32), np.array([[0.0, 1.0], [-1.0, 0.0]], np.float32)) == 0.0
    assert split_segments(" a \n\n b\r\nc ") == ["a", "b", "c"]


def test_run_diagnostics_map_evidence_ids_to_sessions():
    """Units copy each turn verbatim, so every resolvable evidence turn has d_ext = 1; the
    unknown id "zz:9" of q3 is skipped; the seed returns every unit line, prefixed with its date."""
    script = Script()
    rt = Runtime(embedder=HashEmbedder(dim=256))
    rt.register(TASK, ScriptedBackend(script, model_id="task"))
    runner = ProgramRunner(rt, RunnerSettings(extractor="instruction", task_model=TASK))
    run = runner.run(read_program_source(seed_program_path()), [conversation()])
    assert len(run.traces[0].probes) == 5  # distinct resolvable evidence turns: s1:0 s2:1 s3:0 s1:1 s3:1
    rep = diagnose_run(run, rt.embedder)
    assert [t["d_ext"] for t in rep["tasks"]] == [pytest.approx(1.0, abs=1e-6)] * 4
    assert rep["by_capability"]["M"]["n"] == 1 and rep["n_no_evidence"] == 0
    assert rep["n_units"] == 6
    # the units are the six turn texts of tests.helpers.conversation(), 40, 39, 41, 46, 34 and 37 characters
    assert [u["content"] for units in run.traces[0].units for u in units] == [
        "Caroline went to the LGBTQ support group", "Melanie painted a sunrise over the lake",
        "Caroline is researching adoption agencies", "Melanie took her kids camping in the mountains",
        "Caroline gave a talk at the school", "Melanie signed up for a pottery class"]
    assert rep["mean_unit_chars"] == pytest.approx(39.5)  # 237 characters / 6 units
    # the seed ignores the query: the question and every probe get the same 6 dated lines
    text = run.tasks[0].retrieved
    assert len(text.splitlines()) == 6 and text.startswith("[2023-05-01] Caroline went")
    assert rep["mean_retrieved_chars"] == len(text)
    assert all(t["d_idx"] == pytest.approx(t["d_ret"]) for t in rep["tasks"])
    assert 0.5 < rep["overall"]["d_ret"] < 1.0  # the date prefix keeps the match below 1
    json.dumps(rep)  # report-ready
