"""The evolution loop on small LoCoMo subsets: hostile coder output is rejected with reasons and
touches nothing outside the run directory; kill -9 at three points then --resume ends in the
same archive with nothing evaluated twice; the offline params loop raises the seed's valid
answer-recall (a real ranking/indexing variant wins; nothing is planted)."""
from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.api import build_engine, evolve
from memgym.evolution.search.journal import load_archive
from memgym.memory_bank.programs import read_program_source, seed_program_path

ROOT = Path(__file__).resolve().parents[3]
SEED = read_program_source(seed_program_path())
SMALL = dict(train=["conv-26"], valid=["conv-30"], n_sessions=2, max_questions=6, extractor="turns",
             rounds_integrate=0, plan_mode="question", scorer="answer-recall", probe_units=200, probe_batches=10, progress=False,
             embedder="hash:256")


def _tree(root: Path, skip: Path) -> dict:
    out = {}
    for p in sorted(root.rglob("*")):
        if p.is_file() and skip not in p.parents:
            out[str(p)] = hashlib.sha256(p.read_bytes()).hexdigest()
    return out


def _block(search: str, replace: str, why: str = "Change.") -> str:
    return f"{why}\n<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


RET = '        return "\\n".join(self.lines)[:OUT_CHAR_BUDGET]\n'


def test_hostile_and_malformed_coder_output_is_rejected_and_contained(tmp_path):
    sentinel = tmp_path / "precious.txt"
    sentinel.write_text("keep me")
    deleter = SEED.replace("import Optional\n", "import Optional\nimport os\n").replace(
        "        self.lines = []\n", f"        self.lines = []\n        os.remove({str(sentinel)!r})\n")
    writer = _block("        self.lines = []\n",
                    f"        self.lines = []\n        open({str(sentinel)!r}, 'w').write('gone')\n", "Persist.")
    script = [
        "The program looks fine to me; I would not change anything.",                         # 1 prose
        ["<<<<<<< SEARCH\n        return x\n=======\n", "still <<<<<<< SEARCH broken", "no file either"],  # 2
        ["```python\n" + deleter + "```", "I give up."],  # 3 deletes files (import os): level 1
        [writer, "no fix"],  # 4 writes a file at run time: blocked in the sandbox, level 3
        [_block(RET, "        while True:\n            pass\n", "Think harder."), "no fix"],  # 5 loops forever
        [_block("class Memory:\n", "class Store:\n", "Rename."), "no fix"],                   # 6 breaks the contract
        _block('    """An append-only list of rendered units."""\n', '    """Rendered units."""\n'),  # 7 no-op
        _block(RET, '        return "\\n".join(reversed(self.lines))[:OUT_CHAR_BUDGET]\n'),     # 8 valid
        _block(RET, '        return "\\n".join(reversed(self.lines))[:OUT_CHAR_BUDGET]\n'),     # 9 duplicate of 8
    ]
    (tmp_path / "script.json").write_text(json.dumps({"proposals": script}))
    out = tmp_path / "run"
    before = _tree(tmp_path, out)
    cfg = EvolveConfig(**SMALL, proposer="scripted", script=str(tmp_path / "script.json"), rounds_cold=9,
                       rounds_refine=0, validate_timeout_s=20.0, out=str(out))  # generous: r08 must pass
    summary = evolve(cfg).summary
    arch = load_archive(out)
    c = {k: v for k, v in arch.candidates.items()}
    assert c["r01"].status == "failed" and "no usable program" in c["r01"].reason
    assert c["r02"].status == "failed" and "no usable program" in c["r02"].reason
    assert c["r03"].status == "rejected" and c["r03"].reason == "validation level 1: line 12: import of 'os' is " \
                                                                 "not allowed"
    assert c["r04"].status == "rejected" and c["r04"].reason.startswith("validation level 3")
    assert "write" in c["r04"].reason and "precious.txt" in c["r04"].reason
    assert c["r05"].status == "rejected" and c["r05"].reason.startswith("validation level 3")
    assert "timeout" in c["r05"].reason
    assert c["r06"].status == "rejected" and "Memory" in c["r06"].reason
    assert c["r07"].status == "rejected" and c["r07"].reason.startswith("no-op")
    assert c["r08"].status == "evaluated" and c["r08"].valid is not None and c["r08"].changed == ["retrieval"]
    assert c["r09"].status == "rejected" and c["r09"].reason == "duplicate of archived program r08"
    assert summary["candidates_evaluated"] == 1 and summary["proposals_failed"] == 8
    # turns: 3 + 3 (prose, repair, whole-file) + 4 x (1 + a 3-turn revise) + 1 + 1 + 1
    assert summary["candidates_rejected"] == 6 and summary["model_calls"]["coder"] == 25
    assert sentinel.read_text() == "keep me" and _tree(tmp_path, out) == before
    # every proposal is in the run directory with its transcript and outcome
    for i in range(1, 10):
        prop = json.loads((out / f"candidates/r{i:02d}/proposal.json").read_text())
        assert prop["result"]["transcript"] and "ok" in prop["result"]
    assert "| 5 | cold | - | seed | r05 |" in (out / "report.md").read_text()


def _small_recipe(tmp_path: Path) -> Path:
    r = tmp_path / "r.yaml"
    r.write_text("\n".join([
        "dataset: locomo", "train: [conv-26]", "valid: [conv-30]", "test: [conv-41]", "n_sessions: 2",
        "max_questions: 6", "extractor: turns", "plan_mode: question", "scorer: answer-recall", "proposer: params",
        "rounds_cold: 1", "rounds_refine: 2", "rounds_integrate: 0", "seed: 1", "probe_units: 200", "probe_batches: 10",
        "embedder: hash:256", "progress: false"]) + "\n")
    return r


def _score_rows(run: Path) -> int:
    with sqlite3.connect(run / "stages.sqlite") as db:
        return db.execute("SELECT COUNT(*) FROM stages WHERE stage='score'").fetchone()[0]


def _scored(run: Path) -> int:
    n = 0
    for p in (run / "candidates").glob("*/eval.json"):
        items = json.loads(p.read_text())["stage_items"]
        n += items["train"]["score"]["run"] + items["valid"]["score"]["run"]
    return n


def _fingerprint(run: Path):
    return load_archive(run).fingerprint()


def test_kill9_at_three_points_then_resume_matches_the_uninterrupted_run(tmp_path):
    """One chain: killed between rounds 1 and 2, resumed and killed during round 2's proposal,
    resumed and killed during round 3's evaluation, resumed to the end."""
    from memgym.launch.cli import main as memgym

    recipe = _small_recipe(tmp_path)
    ref = tmp_path / "ref"
    assert memgym(["evolve", "--recipe", str(recipe), "--out", str(ref)]) == 0
    ref_summary = json.loads((ref / "summary.json").read_text())
    assert ref_summary["rounds"] == 3 and ref_summary["candidates_evaluated"] == 3
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "killed"
    first = ["evolve", "--recipe", str(recipe), "--out", str(run)]
    for args, point, done in ((first, "round_end:1", 1), (["evolve", "--resume", str(run)], "proposal:2", 1),
                              (["evolve", "--resume", str(run)], "evaluation:3", 2)):
        proc = subprocess.run([sys.executable, "-m", "tests.faults", point, *args], env=env, cwd=ROOT,
                              capture_output=True, text=True, timeout=600)
        assert proc.returncode == -9, proc.stderr[-2000:]
        state = json.loads((run / "state.json").read_text())
        assert state["next_round"] == done + 1 and not (run / "summary.json").exists(), point
    assert (run / "candidates/r02/proposal.json").exists() and not (run / "candidates/r03/eval.json").exists()
    assert memgym(["evolve", "--resume", str(run)]) == 0
    assert _fingerprint(run) == _fingerprint(ref)
    got = json.loads((run / "summary.json").read_text())
    for k in ("rounds", "candidates_evaluated", "proposals_failed", "seed"):
        assert got[k] == ref_summary[k], k
    for k in ("final", "specialists"):
        assert json.dumps(got[k]).replace(str(run), "R") == json.dumps(ref_summary[k]).replace(str(ref), "R")
    # nothing evaluated twice: the same scored (program, task) entries, and no more fresh scoring
    assert _score_rows(run) == _score_rows(ref)
    assert _scored(run) <= _scored(ref)
    assert memgym(["evolve", "--recipe", str(recipe), "--out", str(ref)]) == 2  # a run is there: --resume it


def test_offline_params_loop_raises_the_seeds_valid_answer_recall(tmp_path):
    cfg = EvolveConfig(train=["conv-26"], valid=["conv-30"], max_questions=25, extractor="turns", plan_mode="question",
                       scorer="answer-recall", proposer="params", rounds_cold=3, rounds_refine=0, rounds_integrate=0,
                       seed=0,
                       probe_units=400, probe_batches=20, progress=False, out=str(tmp_path / "run"))
    evo = build_engine(cfg)
    evo.state.callbacks.clear()  # what the run writes is the engine's: no callback to lose
    result = evo.run()
    s = result.summary
    run = tmp_path / "run"
    assert json.loads((run / "summary.json").read_text()) == json.loads(json.dumps(s, default=str))
    # the summary is written from the result; the scores' one copy is eval.json (not state.json, not outcome.json)
    assert s["seed"] == {"valid": result.seed.valid, "test": result.seed.test} and s["final"]["valid"] == result.valid
    assert s["frozen"]["frozen"] == s["final_id"] == result.frozen.id and s["frozen"]["pool"] == result.frozen.pool
    st = json.loads((run / "state.json").read_text())
    assert st["format"] == 2 and not any({"train", "valid", "test"} & set(c) for c in st["archive"]["candidates"])
    assert not any({"train", "valid"} & set(json.loads(p.read_text())) for p in run.glob("candidates/*/outcome.json"))
    assert load_archive(run).get(s["final_id"]).valid.scores() == result.valid
    seed, final = s["seed"]["valid"]["overall"], s["final"]["valid"]["overall"]
    assert final > seed + 0.05, (seed, final)
    # the seed returns the first 16,000 characters unranked; a ranking edit is in the final lineage and won
    lineage = evo.state.archive.lineage(s["final_id"])
    ranked = [c for c in lineage if c.description.startswith("variant dense_ranking")]
    assert ranked and ranked[0].valid.overall > evo.state.archive.get(ranked[0].parent).valid.overall
    assert ranked[0].changed == ["indexing", "retrieval", "shared"]
    best = (tmp_path / "run" / "best.py").read_text()
    assert "def query_text(query):" in best and best == evo.state.source_of(s["final_id"])
    assert (tmp_path / "run" / "capabilities.png").stat().st_size > 10_000


def test_a_spent_budget_stops_the_run_cleanly_with_a_report(tmp_path):
    (tmp_path / "s.json").write_text(json.dumps({"proposals": [_block(RET, '        return ""\n')]}))
    cfg = EvolveConfig(**SMALL, proposer="scripted", script=str(tmp_path / "s.json"), rounds_cold=3, rounds_refine=0,
                       budgets={"coder": 10}, out=str(tmp_path / "run"))
    s = evolve(cfg).summary
    assert s["rounds"] == 1 and s["stopped"].startswith("budget of role 'coder' exhausted")
    assert s["tokens"]["coder"]["prompt"] > 10 and (tmp_path / "run" / "report.md").read_text().count("stopped") == 1
    outcome = json.loads((tmp_path / "run" / "candidates" / "r01" / "outcome.json").read_text())
    st = json.loads((tmp_path / "run" / "state.json").read_text())
    assert [c["status"] for c in st["archive"]["candidates"] if c["id"] == "r01"] == ["evaluated"]
    assert outcome == st["history"][1] and outcome["accepted"] == "no: valid overall did not improve"


def test_compact_cases_come_from_the_kept_train_run_and_equal_the_stage_cache_rebuild(tmp_path, monkeypatch):
    import memgym.evolution.search.evaluator as E

    cfg = EvolveConfig(**SMALL, proposer="params", rounds_cold=1, rounds_refine=0, out=str(tmp_path / "run"))
    evo = build_engine(cfg)
    evo.start()  # evaluates the seed on train (diagnostics) and valid: the train run is kept
    assert list(evo.evaluator.train_runs) == [SEED]
    ids = [t.id for t in evo.state.split_tasks("train")][:3]
    calls = []
    real = E.evaluate_program
    monkeypatch.setattr(E, "evaluate_program", lambda *a, **k: calls.append(a[0]) or real(*a, **k))
    kept = evo.evaluator.case_texts(SEED, ids)
    assert calls == []  # nothing re-run: the traces of the train evaluation made the cases
    evo.evaluator.train_runs.clear()  # as after --resume: rebuilt through the stage cache, same texts
    assert evo.evaluator.case_texts(SEED, ids) == kept and calls == [SEED]
    assert len(kept) == 3 and all(k.strip() for k in kept)


def test_a_memory_too_large_to_snapshot_and_a_failing_test_conversation_end_in_a_report(tmp_path):
    """The frozen program's index is larger than the sandbox's real 16 MiB message cap (every
    snapshot is refused: a cache miss, the run goes on), and it fails on one test conversation
    (conv-42, Nate's): the test phase reports it beside conv-41, in the summary and the report."""
    big = SEED.replace("        self.lines = []\n", "        self.lines = []\n        self.pad = 'x' * 17_000_000\n", 1)
    big = big.replace("    def index(self, units, session):\n", "    def index(self, units, session):\n"
                      "        if any(u.content.startswith('Nate:') for u in units):\n"
                      "            raise RuntimeError('cannot index Nate')\n", 1)
    prog = tmp_path / "big.py"
    prog.write_text(big)
    out = tmp_path / "run"
    cfg = EvolveConfig(**{**SMALL, "test": ["conv-41", "conv-42"], "rounds_cold": 0, "rounds_refine": 0,
                          "seed_program": str(prog), "out": str(out)})
    result = evolve(cfg)
    summary = json.loads((out / "summary.json").read_text())
    why = "index [conv-42]: raised: RuntimeError: cannot index Nate"
    assert summary["final"]["test"]["failed"] == {"conv-42": why} and result.frozen.id == "seed"
    final = json.loads((out / "final.json").read_text())
    tasks = final["final_test"]["tasks"]
    assert len(tasks) == 12 and [v for k, v in tasks.items() if k.startswith("conv-42/")] == [0.0] * 6
    conv41 = [v for k, v in tasks.items() if k.startswith("conv-41/")]
    assert summary["final"]["test"]["overall"] == pytest.approx(sum(conv41) / 12) and sum(conv41) > 0
    report = (out / "report.md").read_text()
    assert f"- final (seed) failed on test conversation conv-42 (its questions scored 0): {why}" in report
    assert (out / "best.py").read_text() == big
