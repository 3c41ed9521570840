"""The dense session reward's result type (its settings are checked through the reward in
tests/rewards/test_session_reward.py)."""
from __future__ import annotations

from memgym.rewards.reward_types import RewardBreakdown


def test_breakdown_is_a_dataclass_with_every_part():
    b = RewardBreakdown(0.5, 1, 0.5, 0.0, 3, 3, None, 1.0, {"episodic": 0, "semantic": 0, "procedural": 0}, None,
                        "counterfactual", [True, False])
    assert b.to_log()["frac_correct"] == 0.5 and b.to_log()["dominant/none"] == 1.0
