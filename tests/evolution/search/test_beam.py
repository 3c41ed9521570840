"""PrisMem's protocol on BEAM and LongMemEval: ``memgym evolve --dataset beam`` on two real 100K
chats (train 100K-3, valid 100K-11; `turns` extraction, rubric-recall, the hash embedder) — a
ranking edit wins on valid and the per-ability tables are reported; kill -9 during an
evaluation then --resume ends in the same archive; the DESIGN splits and the scorer checks; a
LongMemEval test split read from another (M-format) file; the freeze rule on a hand-made
archive."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from memgym.evolution.search.archive import Archive, Candidate, SplitScores
from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.api import build_engine
from memgym.evolution.search.journal import load_archive
from memgym.evolution.search.select import freeze_choice

ROOT = Path(__file__).resolve().parents[3]
BEAM = ["dataset: beam", "train: [100K-3]", "valid: [100K-11]", "test: []", "extractor: turns", "plan_mode: question",
        "scorer: rubric-recall", "proposer: params", "rounds_cold: 3", "rounds_refine: 1", "rounds_integrate: 0",
        "seed: 0", "probe_units: 200", "probe_batches: 10", "embedder: hash:256", "progress: false",
        "baselines: [full_history, bm25]"]


def _fingerprint(run: Path):
    return load_archive(run).fingerprint()


def test_beam_default_splits_and_scorer_checks():
    cfg = EvolveConfig(dataset="beam", scorer="rubric-recall", test=["default"], embedder="hash:64")
    assert cfg.train == [f"100K-{n}" for n in range(3, 11)] and cfg.valid == [f"100K-{n}" for n in range(11, 17)]
    assert cfg.test == ["1M-3", "1M-4", "1M-6", "1M-7", "1M-8", "1M-9", "1M-10", "1M-31"]
    assert cfg.dataset == "beam" and cfg.data_path("test") is None
    # a CLI list given as one comma-joined value: --test 1M-3,1M-31
    assert EvolveConfig(dataset="beam", scorer="rubric-recall", test=["1M-3,1M-31"], embedder="hash:64").test == \
        ["1M-3", "1M-31"]
    with pytest.raises(ValueError, match="rubric-recall needs --dataset beam"):
        EvolveConfig(dataset="locomo", scorer="rubric-recall")


def test_beam_evolution_ranking_wins_on_valid_and_resume_after_kill9_matches(tmp_path):
    from memgym.launch.cli import main as memgym

    recipe = tmp_path / "beam.yaml"
    recipe.write_text("\n".join(BEAM) + "\n")
    ref = tmp_path / "ref"
    assert memgym(["evolve", "--config", str(recipe), "--out", str(ref)]) == 0
    s = json.loads((ref / "summary.json").read_text())
    st = json.loads((ref / "state.json").read_text())
    arch = load_archive(ref)
    seed = arch.get("seed")
    # 100K-11: 20 questions, 2 per ability; the seed returns the first 16,000 characters unranked
    assert len(seed.valid.tasks) == 20 and len(seed.valid.by_category) == 10
    assert seed.valid.retrieved_chars == 16000.0
    # the dense-ranking variant (round 2) is the first to beat it, becomes the base and is frozen
    # (r03 = + hybrid_lexical wins P and M only, with a lower overall; r04 = + mmr beats no specialist,
    # so it is not in the frozen pool)
    r3 = arch.get("r02")
    assert r3.description.startswith("variant dense_ranking") and arch.base == "r02"
    assert r3.valid.overall > seed.valid.overall + 0.1
    assert r3.valid.by_category["information_extraction"] > seed.valid.by_category["information_extraction"]
    assert arch.specialists["M"] == "r03" and arch.get("r04").parent == "r03"
    assert s["final_id"] == "r02" and s["frozen"]["frozen"] == "r02"
    assert set(s["final"]["valid"]["by_category"]) == set(seed.valid.by_category)
    report = (ref / "report.md").read_text()
    assert "## Per ability (valid split)" in report and "| temporal_reasoning |" in report
    assert "## Frozen program" in report and "retrieved chars" in report
    # the report names the protocol behind every score and the sandbox's mode
    assert (s["scorer"], s["judge_protocol"]) == ("rubric-recall", "official") and s["sandbox"].startswith("kernel:")
    assert "- judge_protocol `official` (scorer `rubric-recall`;" in report and "sandbox `kernel:" in report
    # the baselines run beside it on valid: full_history is the seed program itself
    assert s["baselines"]["full_history"]["valid"] == s["seed"]["valid"] and s["baselines"]["bm25"]["test"] is None
    assert "| baseline bm25 | - |" in report
    # the boundary: per capability the peak of any evaluated program vs the frozen one
    peaks = {c: max(x.valid.by_capability[c] for x in arch.evaluated()) for c in s["boundary"]}
    assert {c: v["peak"] for c, v in s["boundary"].items()} == peaks and set(peaks) == set(seed.valid.by_capability)
    assert all(v["gap"] == pytest.approx(v["peak"] - r3.valid.by_capability[c]) for c, v in s["boundary"].items())
    assert (ref / "boundary.png").stat().st_size > 5_000 and "## Performance boundary" in report

    # kill -9 during round 3's evaluation, then resume: the same archive
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    run = tmp_path / "killed"
    proc = subprocess.run([sys.executable, "-m", "tests.faults", "evaluation:3", "evolve", "--config", str(recipe),
                           "--out", str(run)],
                          env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert json.loads((run / "state.json").read_text())["next_round"] == 3 and not (run / "summary.json").exists()
    assert memgym(["evolve", "--resume", str(run)]) == 0
    assert _fingerprint(run) == _fingerprint(ref)
    got = json.loads((run / "summary.json").read_text())
    assert got["final"]["valid"] == s["final"]["valid"] and got["frozen"]["frozen"] == "r02"


def test_longmemeval_test_split_from_another_file(tmp_path):
    """Evolve on S, test on M-format records: ``test_path`` feeds only the test split."""
    from memgym.data_synth.paths import data_root

    s_file = data_root() / "longmemeval" / "longmemeval_s_subset.json"
    splits = json.loads((data_root() / "longmemeval" / "s_splits.json").read_text())
    recs = {r["question_id"]: r for r in json.loads(s_file.read_text())}
    tid = splits["test"][0]
    m = dict(recs[tid])  # an M record has the same schema, with more haystack sessions
    m["haystack_sessions"] = m["haystack_sessions"] * 2
    m["haystack_session_ids"] = m["haystack_session_ids"] + [f"{x}-again" for x in m["haystack_session_ids"]]
    m["haystack_dates"] = m["haystack_dates"] * 2
    (tmp_path / "m.json").write_text(json.dumps([m]))
    cfg = EvolveConfig(dataset="longmemeval", train=splits["train"][:1], valid=splits["valid"][:1], test=[tid],
                       test_path=str(tmp_path / "m.json"), embedder="hash:64", extractor="turns",
                       plan_mode="question", out=str(tmp_path / "run"), progress=False)
    evo = build_engine(cfg)
    (test_conv,) = evo.state.splits["test"]
    assert test_conv.id == tid and len(test_conv.sessions) == 2 * len(recs[tid]["haystack_sessions"])
    assert len(evo.state.splits["train"][0].sessions) == len(recs[splits["train"][0]]["haystack_sessions"])


def _cand(cid, parent, overall, stage="refine"):
    return Candidate(cid, parent, 0, stage, None, "params", status="evaluated",
                     valid=SplitScores(overall, {"F": overall}, {}), train=SplitScores(overall, {"F": overall}, {}))


def test_freeze_rule_on_a_hand_made_archive():
    arch = Archive()
    for c in (_cand("seed", None, 0.50, "seed"), _cand("r01", "seed", 0.55, "cold"), _cand("r02", "r01", 0.70),
              _cand("r03", "r01", 0.62), _cand("r04", "r01", 0.58, "integrate"), _cand("r05", "r01", 0.90)):
        arch.add(c)
    arch.base = "r01"
    arch.specialists = {"F": "r02", "T": "r03", "P": "r02", "M": "r01", "A": "r01"}
    # r05 scores best but is in no role: not in the pool; the specialist r02 beats the base and the merge
    got = freeze_choice(arch, ["r04"])
    assert got["frozen"] == "r02" and got["runner_up"] == "r03"
    assert [p["id"] for p in got["pool"]] == ["r02", "r03", "r04", "r01"]
    assert got["pool"][0]["roles"] == ["specialist FP"] and got["pool"][3]["roles"] == ["base", "specialist MA"]
    assert "r02 (specialist FP) has the best valid overall 0.7000" in got["why"]
    # a tie goes to the later program: a merge equal to the best specialist is frozen
    arch.get("r04").valid = SplitScores(0.70, {"F": 0.7}, {})
    got = freeze_choice(arch, ["r04"])
    assert got["frozen"] == "r04" and got["runner_up"] == "r02" and "a tie" in got["why"]
    # with no merge accepted, the base wins only when nothing beats it
    arch.specialists = {"F": "r01"}
    assert freeze_choice(arch, [])["frozen"] == "r01" and freeze_choice(arch, [])["runner_up"] is None
