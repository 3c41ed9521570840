"""``memgym bench coldchat`` helpers and the CLI's passive OpenMP default (issue 20 item 5)."""
from __future__ import annotations

import sys

import pytest

from launch.bench.coldchat import TODAY, parse_arm, summary_rows
from launch.cli import build_parser, passive_openmp


def test_parse_arm():
    assert parse_arm("t1=MEMGYM_EMBED_THREADS=1") == ("t1", {"MEMGYM_EMBED_THREADS": "1"})
    assert parse_arm("ox=MEMGYM_EMBED_BACKEND=onnx,MEMGYM_EMBED_THREADS=2") == (
        "ox", {"MEMGYM_EMBED_BACKEND": "onnx", "MEMGYM_EMBED_THREADS": "2"})
    for bad in ("t1", "=A=1", "t1=", "t1=A"):
        with pytest.raises(ValueError, match="--arm"):
            parse_arm(bad)
    assert TODAY["MEMGYM_EMBED_BATCH"] == "64" and TODAY["OMP_WAIT_POLICY"] == ""


def test_summary_rows_best_of_repeats_and_ratios():
    runs = [{"arm": "today", "phase": "cold", "wall_s": 150.0, "cpu_s": 90.0, "overall": 0.5, "same_retrieval": True},
            {"arm": "default", "phase": "cold", "wall_s": 60.0, "cpu_s": 70.0, "overall": 0.5, "same_retrieval": True},
            {"arm": "today", "phase": "cold", "wall_s": 120.0, "cpu_s": 95.0, "overall": 0.5, "same_retrieval": True},
            {"arm": "default", "phase": "cold", "wall_s": 80.0, "cpu_s": 60.0, "overall": 0.5, "same_retrieval": False}]
    rows = {(r["arm"], r["phase"]): r for r in summary_rows({"runs": runs})}
    today, new = rows["today", "cold"], rows["default", "cold"]
    assert (today["wall_s"], today["cpu_s"], today["wall_ratio"], today["cpu_ratio"]) == (120.0, 90.0, 1.0, 1.0)
    # best wall 60, best CPU 60: 120/60 = 2.0x and 90/60 = 1.5x; one run retrieved other texts
    assert (new["wall_s"], new["cpu_s"], new["wall_ratio"], new["cpu_ratio"]) == (60.0, 60.0, 2.0, 1.5)
    assert new["same_retrieval"] is False and today["same_retrieval"] is True


def test_bench_coldchat_is_registered():
    args = build_parser().parse_args(["bench", "coldchat", "--chat", "1M-4", "--arm", "t1=MEMGYM_EMBED_THREADS=1"])
    assert args.chat == "1M-4" and args.arm == ["t1=MEMGYM_EMBED_THREADS=1"] and args.repeats == 1


def test_passive_openmp_only_for_embedding_commands_and_never_over_the_user(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as in a fresh `memgym` process
    assert passive_openmp("train") is False and "OMP_WAIT_POLICY" not in __import__("os").environ
    assert passive_openmp("program") is True and __import__("os").environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert passive_openmp("evolve") is False and __import__("os").environ["OMP_WAIT_POLICY"] == "ACTIVE"
