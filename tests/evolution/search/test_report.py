"""Tests of :mod:`memgym.evolution.search.report`."""
from __future__ import annotations

from memgym.evolution.search.report import score_table


def test_score_table_shows_every_capability_its_rows_score():
    """A test split may hold a capability (here P) that the valid split lacks: it gets a column."""
    rows = [("seed", "seed", {"overall": 0.733, "by_capability": {"F": 1.0, "P": 0.333}}),
            ("final", "r02", None)]
    assert score_table(rows, ["F", "T", "M"]) == [
        "| program | id | overall | F | T | P | M | retrieved chars |",
        "|---|---|---|---|---|---|---|---|",
        "| seed | seed | 0.733 | 1.000 | - | 0.333 | - | - |",
    ]
