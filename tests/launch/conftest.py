"""Fixtures of the multi-process launch tests (test_cmd_launch.py, test_zero3.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from memgym.data_synth.paths import expert_dir


@pytest.fixture(scope="module")
def session1_file(tmp_path_factory) -> Path:
    """The first line (session 1) of the expert trajectory conv-26.jsonl, as its own file."""
    p = tmp_path_factory.mktemp("traj") / "conv-26-s1.jsonl"
    p.write_text((expert_dir() / "conv-26.jsonl").read_text().splitlines()[0] + "\n")
    return p
