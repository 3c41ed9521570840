"""ADRPO's data layer (:mod:`training.adrpo_data`): the session-block sampler."""
from __future__ import annotations

import pytest


def test_session_block_sampler_keeps_sessions_whole():
    from training.adrpo_data import ADRPODataError, session_block_sampler

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
