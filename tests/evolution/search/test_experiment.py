"""The experiment harness and the mission's end-to-end path, on small LoCoMo subsets:

- ``memgym evolve experiment`` killed (SIGKILL) right after its first run finished resumes
  without re-running it, and each ablation changed what it should (holistic keeps no
  specialists and runs no integration; no_integration runs no integration round; full does);
- an evolve run whose extraction is a trained extractor (``hf:<tiny random model>``) completes
  with an accepted integration, and the extractor runs once per conversation for the whole run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memgym.evolution.search.archive import Archive
from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.journal import load_archive

ROOT = Path(__file__).resolve().parents[3]


def _recipe(tmp_path: Path) -> Path:
    r = tmp_path / "exp.yaml"
    r.write_text("\n".join([
        "dataset: locomo", "train: [conv-26]", "valid: [conv-30]", "test: [conv-41]", "n_sessions: 2",
        "max_questions: 6", "extractor: turns", "plan_mode: question", "scorer: answer-recall", "proposer: params",
        "rounds_cold: 1", "rounds_refine: 1", "rounds_integrate: 1", "seed: 0", "probe_units: 200",
        "probe_batches: 10", "embedder: hash:256", "progress: false", f"out: {tmp_path / 'exp'}"]) + "\n")
    return r


def _state(run: Path) -> dict:
    return json.loads((run / "state.json").read_text())


def test_experiment_resumes_after_kill9_without_rerunning_finished_runs(tmp_path):
    from memgym.launch.cli import main as memgym

    recipe, out = _recipe(tmp_path), tmp_path / "exp"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.faults", "run_end:full/seed0", "evolve", "experiment",
                           "--recipe", str(recipe),
                           "--variants", "full,holistic,no_integration", "--seeds", "1"], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == -9, proc.stderr[-2000:]
    first = out / "full" / "seed0"
    done_mtime = (first / "summary.json").stat().st_mtime_ns
    st = json.loads((out / "experiment_state.json").read_text())
    assert st["runs"] == {"full/seed0": {"status": "done", "starts": 1, "wall_s": st["runs"]["full/seed0"]["wall_s"]}}
    assert not (out / "experiment.json").exists()
    # the same command again refuses; --resume continues
    assert memgym(["evolve", "experiment", "--recipe", str(recipe), "--variants", "full", "--seeds", "1"]) == 2
    assert memgym(["evolve", "experiment", "--resume", str(out)]) == 0
    st = json.loads((out / "experiment_state.json").read_text())
    assert {k: (v["status"], v["starts"]) for k, v in st["runs"].items()} == {
        "full/seed0": ("done", 1), "holistic/seed0": ("done", 1), "no_integration/seed0": ("done", 1)}
    assert (first / "summary.json").stat().st_mtime_ns == done_mtime  # the finished run was not touched
    data = json.loads((out / "experiment.json").read_text())
    assert data["finished_runs"] == 3 and list(data["aggregate"]) == ["full", "holistic", "no_integration"]
    assert (out / "boundary.png").stat().st_size > 10_000
    md = (out / "experiment.md").read_text()
    assert "| seed program |" in md and "oracle-label router over full's specialists" in md
    assert "paired bootstrap 90% interval" in md
    # each ablation changed what it should
    full, hol, noi = (_state(out / v / "seed0") for v in ("full", "holistic", "no_integration"))
    assert [h["stage"] for h in full["history"]] == ["seed", "cold", "refine", "integrate"]
    assert [h["stage"] for h in noi["history"]] == ["seed", "cold", "refine"]
    assert [h["stage"] for h in hol["history"]] == ["seed"] + ["holistic"] * 3
    assert Archive.from_json(hol["archive"]).specialists == {}
    assert json.loads((out / "holistic/seed0/summary.json").read_text())["specialists"] == {}
    assert data["aggregate"]["holistic"]["router_test"] is None
    # the seed program is the same in every run (one baseline row)
    seeds = {json.dumps(json.loads((out / v / "seed0/summary.json").read_text())["seed"]) for v in
             ("full", "holistic", "no_integration")}
    assert len(seeds) == 1


PROGRAM = '''"""Test seed: the seed's append-only memory plus two constant notes (empty here)."""
from dataclasses import dataclass
from typing import Optional

OUT_CHAR_BUDGET = 16_000
NOTE_A = ""
NOTE_B = ""

EXTRACTION_INSTRUCTION = "Write one memory unit per fact as a JSON list of objects with the field content."
PLANNING_INSTRUCTION = 'Answer with one JSON object with the field "question".'
ANSWER_INSTRUCTION = "Answer the question using only the memory below."


@dataclass
class MemoryUnit:
    content: str
    date: Optional[str] = None
    part: Optional[str] = None
    entry_id: Optional[str] = None
    session: Optional[int] = None


@dataclass
class Query:
    question: str


class Memory:
    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.lines = []

    def index(self, units, session):
        for unit in units:
            self.lines.append(unit.content)

    def retrieve(self, query):
        return "\\n".join(self.lines + [NOTE_A, NOTE_B])[:OUT_CHAR_BUDGET]
'''


def _note(name: str, text: str) -> str:
    return f"Remember.\n<<<<<<< SEARCH\n{name} = \"\"\n=======\n{name} = {text!r}\n>>>>>>> REPLACE\n"


@pytest.mark.parametrize("onto", ["base", "best"])
def test_trained_extractor_run_completes_with_integration_and_extracts_once_per_conversation(tmp_path,
                                                                                              tiny_model_dir, onto):
    """The random-weight extractor writes no valid manager JSON (0 units), so the scripted
    proposer's edits are what moves the scores: round 1 (target F) writes conv-30's F answers
    into NOTE_A, round 2 (target T) its T answers into NOTE_B; integration's offline merge
    takes NOTE_A from one specialist and NOTE_B from the other (``onto: base``: both merged onto
    the seed; ``onto: best``: r02's NOTE_B merged onto r01, the best single program). This
    checks the plumbing of the end-to-end path, not the method's quality."""
    from memgym.evolution.search.api import evolve

    seed = tmp_path / "seed.py"
    seed.write_text(PROGRAM)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"proposals": [
        _note("NOTE_A", "by dancing. He lost his job and decided to start his own business to share his passion."),
        _note("NOTE_B", "19 January, 2023")]}))
    cfg = EvolveConfig(train=["conv-26"], valid=["conv-30"], test=["conv-41"], n_sessions=2, max_questions=6,
                       extractor=f"hf:{tiny_model_dir}", extractor_max_new_tokens=16, plan_mode="question",
                       scorer="answer-recall", proposer="scripted", script=str(script), seed_program=str(seed),
                       rounds_cold=0, rounds_refine=2, rounds_integrate=2, cache="none", probe_units=200,
                       probe_batches=10, embedder="hash:256", progress=False, out=str(tmp_path / "run"),
                       integrate_onto=onto)
    s = evolve(cfg).summary
    st = _state(tmp_path / "run")
    arch = load_archive(tmp_path / "run")
    assert [h["target"] for h in st["history"][1:3]] == ["F", "T"]
    assert arch.specialists == {"F": "r01", "T": "r02", "M": "r01"}
    assert [h["stage"] for h in st["history"][3:]] == ["integrate", "integrate"]
    merge = arch.integrations[0]
    assert (merge.round, merge.candidate, merge.attempt, merge.integrated) == (3, "r03", "merge", True)
    assert merge.merged_from == (["r01 (FM)", "r02 (T)"] if onto == "base" else ["r02 (T)"])
    assert merge.conflicts == [] and merge.anchor == ("seed" if onto == "base" else "r01")
    # the next round merges the specialists onto the accepted merge r03: it holds all they changed
    skip = "skipped: the specialists add nothing to the accepted merge r03 (every change is in it or was left out)"
    assert arch.integrations[1].anchor == "r03"
    assert arch.integrations[1].accepted == st["history"][4]["accepted"] == skip
    assert s["final_id"] == "r03" and s["integrated"] and s["final"]["valid"]["overall"] > \
        max(arch.get("r01").valid.overall, arch.get("r02").valid.overall)
    best = (tmp_path / "run" / "best.py").read_text()
    assert "NOTE_A = 'by dancing." in best and "NOTE_B = '19 January, 2023'" in best
    # extraction: 2 sessions x 4 managers per conversation, once for each of the 3 conversations
    # (train, valid, test) over 4 evaluated programs, the seed and 3 run on test; no response cache
    assert s["model_calls"]["extractor"] == 3 * 2 * 4
    assert s["candidates_evaluated"] == 3 and s["final"]["test"] is not None


def test_coder_integration_gets_diffs_and_paired_traces_and_a_failed_merge_goes_back(tmp_path):
    """Scripted coder, offline first try off: integration round 1 answers with a change that
    does not beat the base (rejected); round 2 gets that failed merge as its parent with its
    verdict and traces, and merges both specialists' notes (accepted)."""
    from memgym.evolution.search.api import evolve

    seed = tmp_path / "seed.py"
    seed.write_text(PROGRAM)
    both = (_note("NOTE_A", "by dancing. He lost his job and decided to start his own business to share his passion.")
            + _note("NOTE_B", "19 January, 2023").split("\n", 1)[1])
    instr = ('Reword.\n<<<<<<< SEARCH\nANSWER_INSTRUCTION = "Answer the question using only the memory below."\n'
             '=======\nANSWER_INSTRUCTION = "Answer briefly from the memory below."\n>>>>>>> REPLACE\n')
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"proposals": [
        _note("NOTE_A", "by dancing. He lost his job and decided to start his own business to share his passion."),
        _note("NOTE_B", "19 January, 2023"), instr, both]}))
    cfg = EvolveConfig(train=["conv-26"], valid=["conv-30"], n_sessions=2, max_questions=6, extractor="turns",
                       plan_mode="question", scorer="answer-recall", proposer="scripted", script=str(script),
                       seed_program=str(seed), rounds_cold=0, rounds_refine=2, rounds_integrate=2,
                       integrate_offline_first=False, integrate_onto="base", probe_units=200, probe_batches=10, embedder="hash:256",
                       progress=False, out=str(tmp_path / "run"))
    s = evolve(cfg).summary
    run = tmp_path / "run"
    st = _state(run)
    hist, (r3, r4) = st["history"], st["archive"]["integrations"]
    assert r3["attempt"] == "coder" and hist[3]["parent"] == "seed" and not r3["integrated"]
    assert r3["accepted"] == hist[3]["accepted"]
    assert r3["accepted"].startswith("no: valid overall") and "does not beat the base's" in r3["accepted"]
    assert r4["attempt"] == "coder" and hist[4]["parent"] == "r03" and r4["integrated"]
    assert s["final_id"] == "r04" and s["integrated"]
    p3 = json.loads((run / "candidates/r03/proposal.json").read_text())["result"]["transcript"][0]["messages"][-1]["content"]
    assert "# Integration material" in p3 and "## Specialist r01 for F" in p3 and "## Specialist r02 for T" in p3
    assert "+NOTE_A = 'by dancing." in p3 and "+NOTE_B = '19 January, 2023'" in p3  # the diffs against the base
    assert "Paired differential case for T: conv-26/conv-26/q" in p3
    assert "trace of base seed" in p3 and "trace of specialist T r02" in p3 and "Integrate the capability" in p3
    p4 = json.loads((run / "candidates/r04/proposal.json").read_text())["result"]["transcript"][0]["messages"][-1]["content"]
    assert "The previous merge r03 was not accepted: no: valid overall" in p4 and "trace of failed merge r03" in p4
    assert "Answer briefly from the memory below." in p4  # the failed implementation is the program shown
    report = (run / "report.md").read_text()
    assert "## Integration attempts" in report and "| 4 | coder | r01 (F" in report


def test_kill9_during_the_integration_evaluation_then_resume_matches(tmp_path):
    from memgym.launch.cli import main as memgym

    (tmp_path / "seed.py").write_text(PROGRAM)
    (tmp_path / "script.json").write_text(json.dumps({"proposals": [
        _note("NOTE_A", "by dancing. He lost his job and decided to start his own business to share his passion."),
        _note("NOTE_B", "19 January, 2023")]}))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("\n".join([
        "dataset: locomo", "train: [conv-26]", "valid: [conv-30]", "n_sessions: 2", "max_questions: 6",
        "extractor: turns", "plan_mode: question", "scorer: answer-recall", "proposer: scripted",
        f"script: {tmp_path / 'script.json'}", f"seed_program: {tmp_path / 'seed.py'}", "rounds_cold: 0",
        "rounds_refine: 2", "rounds_integrate: 1", "probe_units: 200", "probe_batches: 10", "embedder: hash:256",
        "progress: false"]) + "\n")
    ref, run = tmp_path / "ref", tmp_path / "killed"
    assert memgym(["evolve", "--recipe", str(recipe), "--out", str(ref)]) == 0
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.faults", "evaluation:3", "evolve", "--recipe", str(recipe),
                           "--out", str(run)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (run / "candidates/r03/proposal.json").exists() and not (run / "candidates/r03/eval.json").exists()
    assert memgym(["evolve", "--resume", str(run)]) == 0
    fp = [load_archive(d).fingerprint() for d in (ref, run)]
    assert fp[0] == fp[1]
    a, b = (json.loads((d / "summary.json").read_text()) for d in (ref, run))
    assert a["final_id"] == b["final_id"] == "r03" and a["integrated"] and b["integrated"]
    assert a["final"]["valid"] == b["final"]["valid"]
    assert [h["accepted"] for h in _state(ref)["history"]] == [h["accepted"] for h in _state(run)["history"]]
