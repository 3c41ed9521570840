"""scripts/adrpo_weighting.py: the identity-adapter check (an adapter that never saw a gradient
reuses its init's validation), the seed-spread summary and the population std of a group."""
from __future__ import annotations

import torch
from safetensors.torch import save_file

from scripts.adrpo_weighting import _mean_spread, _std, identity_adapter


def test_identity_adapter_is_all_lora_b_zero(tmp_path):
    a = torch.ones(16, 576)
    save_file({"base_model.model.layers.0.q_proj.lora_A.weight": a,
               "base_model.model.layers.0.q_proj.lora_B.weight": torch.zeros(576, 16)},
              str(tmp_path / "adapter_model.safetensors"))
    assert identity_adapter(tmp_path) is True  # lora_A nonzero does not matter: B A = 0
    b = torch.zeros(576, 16)
    b[3, 2] = 1e-8
    save_file({"base_model.model.layers.0.q_proj.lora_A.weight": a,
               "base_model.model.layers.0.q_proj.lora_B.weight": b}, str(tmp_path / "adapter_model.safetensors"))
    assert identity_adapter(tmp_path) is False


def test_group_std_and_seed_spread():
    # the screened conv-26/s2/core group: 3 x NONE (0.9667) + 1 invalid JSON (0)
    assert round(_std([0.9667, 0.0, 0.9667, 0.9667]), 4) == 0.4186  # sqrt(3/16) x 0.9667
    assert _std([0.86] * 4) == 0.0
    assert _mean_spread([0.40, 0.44]) == "0.420 ± 0.020"
    assert _mean_spread([]) == "-"


def test_screened_keys_reads_the_selection_and_refuses_an_empty_one(tmp_path):
    import json

    import pytest

    from scripts.adrpo_weighting import screened_keys

    p = tmp_path / "screen.json"
    p.write_text(json.dumps({"selected": ["conv-26/s2/core"], "rows": {}}))
    assert screened_keys(p) == ["conv-26/s2/core"]
    p.write_text(json.dumps({"selected": [], "rows": {}}))
    with pytest.raises(SystemExit, match="selected no row"):
        screened_keys(p)
    with pytest.raises(SystemExit, match="no such file"):
        screened_keys(tmp_path / "missing.json")
