"""ADRPO's data layer (:mod:`memgym.training.adrpo_data`): the session-block sampler."""
from __future__ import annotations

import pytest


def test_session_block_sampler_keeps_sessions_whole():
    from memgym.training.adrpo_data import ADRPODataError, session_block_sampler

    data = list(range(12))  # 3 sessions x 4 managers
    s = session_block_sampler(data, block=4, mini_repeat_count=2, batch_size=4, repeat_count=1, shuffle=True, seed=3)
    idx = list(s)
    assert len(idx) == len(s) == 24
    blocks = [idx[i:i + 8] for i in range(0, 24, 8)]
    for b in blocks:
        first = b[0] - b[0] % 4
        assert b == [first, first, first + 1, first + 1, first + 2, first + 2, first + 3, first + 3]
    assert sorted(b[0] for b in blocks) == [0, 4, 8]
    with pytest.raises(ADRPODataError, match="multiple of 4"):
        session_block_sampler(data, block=4, mini_repeat_count=2, batch_size=6, repeat_count=1, shuffle=False,
                              seed=0)


def _sample(conv: str, session: int, manager: str):
    from memgym.memory_bank.bank import MemoryBank
    from memgym.rewards.samples import RewardSample

    return RewardSample(key=f"{conv}/s{session}/{manager}", conversation_id=conv, session=session, manager=manager,
                        messages=[{"role": "user", "content": "x"}], expert_outputs={}, bank_before=MemoryBank())


def test_select_samples_keeps_the_row_keys_in_file_order():
    from memgym.training.adrpo_data import ADRPODataError, select_samples

    samples = [_sample("conv-26", s, m) for s in (1, 2) for m in ("core", "episodic", "semantic")]
    kept = select_samples(samples, keys=["conv-26/s2/core", "conv-26/s1/semantic"])
    assert [s.key for s in kept] == ["conv-26/s1/semantic", "conv-26/s2/core"]  # the file's order, not the list's
    # keys and sessions combine: s1/semantic is not in session 2
    assert [s.key for s in select_samples(samples, keys=["conv-26/s2/core", "conv-26/s1/semantic"], sessions=[2])] \
        == ["conv-26/s2/core"]
    with pytest.raises(ADRPODataError, match=r"\['conv-26/s9/core'\] match no row"):
        select_samples(samples, keys=["conv-26/s1/core", "conv-26/s9/core"])
