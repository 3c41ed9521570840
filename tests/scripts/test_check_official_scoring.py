"""The independent re-implementation of the official scorings (scripts/experiments/official_scoring/run.py)
agrees with memgym on the same fake-judge replies, for every protocol."""
from __future__ import annotations

import importlib.util
from pathlib import Path


def test_independent_official_scoring_agrees_with_memgym():
    path = Path(__file__).resolve().parents[2] / "scripts" / "experiments" / "official_scoring" / "run.py"
    spec = importlib.util.spec_from_file_location("check_official_scoring", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    lines: list[str] = []
    assert mod.run(n=20, out=lines.append), "\n".join(lines)
    assert sum("AGREE" in ln for ln in lines) == 4
