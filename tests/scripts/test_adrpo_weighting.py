"""scripts/experiments/adrpo_weighting/run.py: the population std of a group and the seed-spread
summary."""
from __future__ import annotations

import importlib.util
from pathlib import Path

_path = Path(__file__).resolve().parents[2] / "scripts" / "experiments" / "adrpo_weighting" / "run.py"
_spec = importlib.util.spec_from_file_location("adrpo_weighting", _path)
_mod = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_mod)
_mean_spread, _std = _mod._mean_spread, _mod._std


def test_group_std_and_seed_spread():
    # the screened conv-26/s2/core group: 3 x NONE (0.9667) + 1 invalid JSON (0)
    assert round(_std([0.9667, 0.0, 0.9667, 0.9667]), 4) == 0.4186  # sqrt(3/16) x 0.9667
    assert _std([0.86] * 4) == 0.0
    assert _mean_spread([0.40, 0.44]) == "0.420 ± 0.020"
    assert _mean_spread([]) == "-"
