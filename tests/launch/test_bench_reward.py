"""``memgym bench reward`` machinery: batched and one-by-one rewards agree, and a warm-cache
re-run makes no model call (real MiniLM, a 4-completion batch to stay fast)."""
from __future__ import annotations

import pytest

from data_synth.paths import expert_dir
from launch.bench.reward import bench_reward

pytestmark = pytest.mark.filterwarnings("ignore::data_synth.errors.DataQuirkWarning")


@pytest.mark.slow
def test_bench_reward_small_batch_with_minilm():
    r = bench_reward(expert_dir() / "conv-30.jsonl", n=4)
    assert (r["completions"], r["sessions"]) == (4, 1)
    assert r["rewards_equal"] is True
    assert r["warm_model_calls"] == {"embed": 0, "llm": 0}
    with pytest.raises(ValueError, match="fewer than the 500"):
        bench_reward(expert_dir() / "conv-30.jsonl", n=500)
