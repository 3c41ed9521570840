"""ADRPO's reward function for TRL (:class:`memgym.training.adrpo_trainer.SessionRewardFunction`):
rollout indices, unknown keys and truncation read from token ids. The trainer's real TRL steps
are in tests/training/test_adrpo.py."""
from __future__ import annotations

import dataclasses

import pytest


def test_reward_function_rollout_index_and_unknown_key():
    from memgym.training.adrpo_trainer import SessionRewardFunction

    seen = {}

    @dataclasses.dataclass
    class B:
        reward: float
        gate: int = 1
        dominant: str | None = None
        weight: float = 1.0

    def reward(samples, completions, rollout_index=None):
        seen.update(samples=samples, completions=completions, k=rollout_index)
        return [B(0.25 * i) for i in range(len(samples))]

    fn = SessionRewardFunction(reward, {"a": "SA", "b": "SB"}, num_generations=4)
    fn.rollout_offset = 6  # this process's first completion is the 7th of the global batch
    out = fn(prompts=[None] * 4, completions=[[{"role": "assistant", "content": f"y{i}"}] for i in range(4)],
             key=["a", "a", "b", "b"])
    assert out == [0.0, 0.25, 0.5, 0.75]
    assert seen == {"samples": ["SA", "SA", "SB", "SB"], "completions": ["y0", "y1", "y2", "y3"], "k": [2, 3, 0, 1]}
    assert [b.reward for b in fn.breakdowns] == out
    with pytest.raises(KeyError, match="'zz'"):
        fn(prompts=[None], completions=["x"], key=["zz"])


def test_adrpo_reward_function_reads_truncation_from_token_ids():
    from memgym.training.adrpo_trainer import SessionRewardFunction

    fn = SessionRewardFunction(None, {}, num_generations=2)
    assert fn.finish_reasons([[5, 6, 2], [5, 6, 7]]) is None  # stop ids not set yet
    fn.stop_token_ids = {2, 0}
    assert fn.finish_reasons([[5, 6, 2], [5, 6, 7], [4, 0]]) == ["stop", "length", "stop"]
