"""What a newcomer trial found after the evolution, BEAM and house merges: the S-subset splits
of LongMemEval by name, a flag typo with a suggestion, and `memgym bench cases` running."""
from __future__ import annotations

import json

import pytest

from data_synth.paths import data_root
from data_synth.splits import split_ids
from launch.cli import main


def test_longmemeval_s_splits_by_name():
    s_splits = data_root() / "longmemeval" / "s_splits.json"
    sizes = {name: len(split_ids("longmemeval", name, s_splits)) for name in ("train", "valid", "test")}
    assert sizes == {"train": 52, "valid": 47, "test": 100}  # data README: {train: 52, valid: 47, test: 100}
    with pytest.raises(ValueError, match="s_splits.json"):
        split_ids("longmemeval", "train")  # splits.json has sft/rl/test only


def test_data_stats_on_the_s_subset_with_its_splits(capsys):
    lme = data_root() / "longmemeval"
    assert main(["data", "stats", "--dataset", "longmemeval", "--path", str(lme / "longmemeval_s_subset.json"),
                 "--splits-path", str(lme / "s_splits.json"), "--split", "valid"]) == 0
    assert json.loads(capsys.readouterr().out)["questions"] == 47


def test_a_flag_typo_names_the_closest_field(capsys):
    rc = main(["eval", "--config", "launch/recipes/demo_locomo.yaml", "--max_qestions", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["memgym eval: unknown option(s): --max_qestions (did you mean --max_questions?); "
                               "--help lists every field"]


@pytest.mark.slow
def test_bench_cases_runs_and_keeps_every_evidence_unit(capsys):
    assert main(["bench", "cases", "--conversations", "conv-26", "--max-cases", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert report["evidence_survival"] == 1.0
    assert report["programs"]["seed"]["cases"] == 2 and report["token_ratio"] < 1.0


def test_evolve_bad_ids_leave_no_run_behind(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["evolve", "--config", "launch/recipes/evolve_locomo_offline.yaml", "--train", "conv-99",
            "--out", str(out), "--embedder", "hash:64", "--no_progress"]
    assert main(argv) == 2
    assert "conv-99" in capsys.readouterr().err
    assert not (out / "recipe.json").exists()  # the corrected command is not told "already holds a run"
    assert main(["evolve", "--resume", str(out)]) == 2
    assert "recipe.json is missing" in capsys.readouterr().err


def test_evolve_empty_test_means_no_test_run():
    from evolution.search.config import EvolveConfig

    cfg = EvolveConfig(test=[""], embedder="hash:64")
    assert cfg.test == [] and cfg.train == ["conv-26", "conv-30"]
