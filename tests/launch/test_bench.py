"""Tests of :mod:`launch.bench`."""
from __future__ import annotations

import json

import pytest

from launch.cli import main, main as memgym


@pytest.mark.slow
def test_bench_cases_runs_and_keeps_every_evidence_unit(capsys):
    assert main(["bench", "cases", "--conversations", "conv-26", "--max-cases", "2"]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    report = json.loads(out[-1])
    assert report["evidence_survival"] == 1.0
    assert report["programs"]["seed"]["cases"] == 2 and report["token_ratio"] < 1.0


@pytest.mark.parametrize("argv, message", [
    (["retrieval", "--sizes", "100000000"], "argument --sizes: must be between 1 and 5,000,000, got 100000000"),
    (["cases", "--max-cases", "0"], "argument --max-cases: must be between 1 and 100,000, got 0"),
    (["cases", "--conversations", "conv-99"], "argument --conversations: unknown LoCoMo conversation 'conv-99'; "
                                              "known: conv-26, conv-30, conv-41, conv-42, conv-43, conv-44, conv-47, "
                                              "conv-48, conv-49, conv-50"),
    (["reuse", "--conversations", "conv-41"], "argument --conversations: conversation 'conv-41' has no expert "
                                              "trajectory in "),
    (["round", "--valid", "conv-7"], "argument --valid: unknown LoCoMo conversation 'conv-7'"),
    (["constrained", "--batch-size", "0"], "argument --batch-size: must be between 1 and 256, got 0"),
    (["constrained", "--rounds", "0"], "argument --rounds: must be between 1 and 100, got 0"),
    (["reward", "--n", "-3"], "argument --n: must be between 1 and 100,000, got -3"),
    (["train", "--reps", "0"], "argument --reps: must be between 1 and 1,000,000, got 0"),
    (["sandbox", "--starts", "0"], "argument --starts: must be between 1 and 10,000, got 0"),
])
def test_bench_arguments_are_checked_at_parse_time(argv, message, capsys):
    with pytest.raises(SystemExit) as e:
        memgym(["bench", *argv])
    assert e.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert err.startswith(f"memgym bench {argv[0]}: error: {message}"), err


def test_retrieval_sizes_beyond_the_memory_are_refused_before_work(capsys):
    from launch.bench.args import physical_memory_bytes

    gib = physical_memory_bytes() / 2**30
    assert memgym(["bench", "retrieval", "--sizes", "5000000", "--dim", "8192"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"memgym bench retrieval: --sizes 5,000,000 x --dim 8192 needs about 457.8 GiB, more than half of this "
                   f"machine's {gib:.1f} GiB: use smaller sizes")


def test_bench_sandbox_runs_and_the_scores_are_equal(capsys):
    """The smallest sandbox bench: one start and one evaluation per side, one session."""
    assert memgym(["bench", "sandbox", "--starts", "1", "--rounds", "1", "--sessions", "1"]) == 0
    report = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert report["evaluations"]["scores_equal"] is True and report["evaluations"]["conversations"] == 1
    assert report["starts"]["starts"] == 1
