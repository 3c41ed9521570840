"""The dense session reward: gate, modes, prior sessions, attribution, batching and caching."""
from __future__ import annotations

import json

import pytest

from memgym.llm.base import GenerationParams
from memgym.llm.cache import CachedBackend, ResponseCache
from memgym.llm.embeddings import HashEmbedder
from memgym.memory_bank.bank import MemoryBank
from memgym.rewards.session_reward import SessionReward, SessionRewardConfig, frac_reward_zero_std
from tests.helpers import CUT, DOG, EMPTY, PILOT, ScriptedBackend, WordTokenizer, bank_with, make_samples, ops, qa


def reward(**cfg) -> SessionReward:
    return SessionReward(SessionRewardConfig(**cfg), embedder=HashEmbedder(512), tokenizer=WordTokenizer())


@pytest.mark.parametrize("mode", ["counterfactual", "isolated"])
def test_prior_session_memory_answers_at_reward_time(mode):
    """The question's evidence lies in session 1 and only the bank before session 2 holds it.
    Public code filtered prior-session memories out of retrieval; then acc would be 0."""
    before = bank_with(1, episodic=[DOG])
    samples = make_samples(before, 2, {"semantic": ops(PILOT)},
                           [qa("What is the name of the dog Alice adopted?", "Biscuit", ["D1:3"])],
                           managers=["episodic"])
    (b,) = reward(mode=mode)(samples, ['{"operations": []}'])
    assert b.gate == 1 and b.acc == 1.0 and b.correct == [True]
    assert b.counts["episodic"] == 1


def test_joint_mode_keeps_prior_sessions_too():
    before = bank_with(1, episodic=[DOG])
    samples = make_samples(before, 2, {}, [qa("What is the name of the dog Alice adopted?", "Biscuit", ["D1:3"])])
    out = reward(mode="joint")(samples, [EMPTY[s.manager] for s in samples], [0, 0, 0, 0])
    assert [b.acc for b in out] == [1.0] * 4


def test_format_gate_zero_reward_and_bank_untouched():
    before = bank_with(1, episodic=[DOG], semantic=[PILOT], core="Alice and Bob are neighbours.")
    snapshot = before.dumps()
    samples = make_samples(before, 2, {}, [qa("What is the name of the dog Alice adopted?", "Biscuit")],
                           managers=["episodic", "episodic", "episodic", "core"])
    bad = [
        # one valid op followed by one with an unknown id: nothing may be half-applied
        json.dumps({"operations": [{"action": "DELETE", "id": "E1"}, {"action": "UPDATE", "id": "E9", "memory": "x"}]}),
        "I think we should add a memory about the dog.",
        '{"operations": [{"action": "UPDATE", "id": "S1", "memory": "wrong part"}]}',
        '{"operation": "REPLACE", "old_text": "not in core", "new_text": "y"}',
    ]
    out = reward()(samples, bad)
    assert [b.gate for b in out] == [0, 0, 0, 0]
    assert [b.reward for b in out] == [0.0] * 4
    assert [b.error_type for b in out] == ["unknown_id", "parse_error", "wrong_part", "replace_text_not_found"]
    assert before.dumps() == snapshot
    # the same sample with a valid output in the same batch still scores
    ok = reward()(samples[:2], [bad[0], '{"operations": [{"action": "DELETE", "id": "E1"}]}'])
    assert ok[0].gate == 0 and ok[1].gate == 1 and ok[1].acc == 0.0  # the deleted dog memory is gone
    assert before.dumps() == snapshot


def test_counterfactual_keeps_other_managers_expert_ops_isolated_does_not():
    before = bank_with(1, episodic=[DOG])
    samples = make_samples(before, 2, {"semantic": ops(PILOT)}, [qa("What is Bob's job?", "airline pilot")],
                           managers=["episodic"])
    (cf,) = reward(mode="counterfactual")(samples, ['{"operations": []}'])
    (iso,) = reward(mode="isolated")(samples, ['{"operations": []}'])
    assert cf.acc == 1.0 and cf.counts["semantic"] == 1
    assert iso.acc == 0.0 and iso.counts["semantic"] == 0


def test_joint_mode_combines_the_kth_rollouts_and_needs_all_four():
    before = MemoryBank()
    q = [qa("What is the name of the dog Alice adopted?", "Biscuit"), qa("What is Bob's job?", "airline pilot")]
    samples = make_samples(before, 1, {}, q) * 2  # two rollouts (k = 0, 1) of the four managers
    comps = [EMPTY["core"], ops(DOG), ops(PILOT), EMPTY["procedural"],        # k = 0: both facts
             EMPTY["core"], ops(DOG), "not json at all", EMPTY["procedural"]]  # k = 1: semantic invalid
    out = reward(mode="joint")(samples, comps, [0, 0, 0, 0, 1, 1, 1, 1])
    assert [b.acc for b in out[:4]] == [1.0] * 4
    assert [b.gate for b in out[4:]] == [1, 1, 0, 1]
    assert [b.acc for b in out[4:]] == [0.5, 0.5, 0.0, 0.5]  # the invalid rollout applies nothing
    with pytest.raises(ValueError, match="joint mode needs exactly one row per manager"):
        reward(mode="joint")(samples[:3], comps[:3], [0, 0, 0])
    with pytest.raises(ValueError, match="rollout_index"):
        reward(mode="joint")(samples[:4], comps[:4])


def test_attribution_tie_gives_no_dominant_part():
    before = MemoryBank()
    samples = make_samples(before, 1, {}, [qa("What is the name of the dog Alice adopted?", "Biscuit")])
    comps = [EMPTY["core"], ops(DOG), ops(PILOT), EMPTY["procedural"]]
    out = reward(mode="joint", alpha=4.0)(samples, comps, [0] * 4)
    assert out[0].counts == {"episodic": 1, "semantic": 1, "procedural": 0}
    assert [b.dominant for b in out] == [None] * 4
    assert [b.weight for b in out] == [1.0] * 4
    # one more episodic entry breaks the tie: episodic gets alpha, everyone else 1 (core never dominant)
    comps[1] = ops(DOG, "2023-05-02: Alice walked Biscuit in the park")
    out = reward(mode="joint", alpha=4.0)(samples, comps, [0] * 4)
    assert [b.dominant for b in out] == ["episodic"] * 4
    assert [b.weight for b in out] == [1.0, 4.0, 1.0, 1.0]


def test_attribution_on_correct_counts_only_correctly_answered_questions():
    before = bank_with(1, episodic=[DOG], semantic=["Carol - Hobby: Carol has a hobby she enjoys on weekends"])
    questions = [qa("What is the name of the dog Alice adopted?", "Biscuit"),
                 qa("What hobby does Carol have on weekends?", "knitting")]
    samples = make_samples(before, 2, {}, questions, managers=["episodic", "semantic"])
    comps = [EMPTY["episodic"], EMPTY["semantic"]]
    all_ = reward(retrieval_top_k=1, attribution_on="all")(samples, comps)
    corr = reward(retrieval_top_k=1, attribution_on="correct")(samples, comps)
    assert all_[0].correct == [True, False] and all_[0].acc == 0.5
    assert all_[0].counts == {"episodic": 1, "semantic": 1, "procedural": 0} and all_[0].dominant is None
    assert corr[0].counts == {"episodic": 1, "semantic": 0, "procedural": 0} and corr[0].dominant == "episodic"
    assert [b.weight for b in corr] == [4.0, 1.0]


def test_reward_formula_with_length_penalty():
    """R = g · acc · (1 - λ·LP); lengths in (here: whitespace) tokens."""
    before = bank_with(1, episodic=[DOG])
    expert = ops(PILOT)  # 17 whitespace tokens
    samples = make_samples(before, 2, {"semantic": expert}, [qa("What is Bob's job?", "airline pilot")],
                           managers=["semantic"])
    long_out = ops(PILOT + " " + " ".join(["padding"] * 400))  # 417 tokens vs 17: r ≫ 2 → LP = 1
    (b,) = reward(lam=0.8)(samples, [long_out])
    assert (b.length_tokens, b.expert_length_tokens) == (417, 17)
    assert b.lp == 1.0 and b.acc == 1.0 and b.reward == pytest.approx(0.2)
    (same,) = reward(lam=0.8)(samples, [expert])
    assert same.lp == 0.0 and same.reward == 1.0
    # core: LP from the written content only (275 tokens → 0.5)
    core_samples = make_samples(before, 2, {}, [qa("What is the name of the dog Alice adopted?", "Biscuit")],
                                managers=["core"])
    core_out = json.dumps({"operation": "APPEND", "content": " ".join(["w"] * 275)})
    (c,) = reward(lam=0.8)(core_samples, [core_out])
    assert (c.length_tokens, c.lp, c.reward) == (275, 0.5, pytest.approx(0.6))
    log = c.to_log()
    assert log["reward"] == pytest.approx(0.6) and log["dominant/episodic"] == 1.0 and log["retrieved/episodic"] == 1.0
    assert all(isinstance(v, float) for v in log.values())


class CountingBackend(ScriptedBackend):
    def __init__(self, fn):
        super().__init__(fn)
        self.generate_calls = 0

    def generate(self, batch, params):
        self.generate_calls += 1
        return super().generate(batch, params)


def _answer(messages, params):
    """Answers from the memory shown, like a perfect reader."""
    memory, question = messages[-1]["content"].split("Question: ")
    if "dog" in question and "Biscuit" in memory:
        return "Biscuit"
    if "job" in question and "pilot" in memory:
        return "An airline pilot"
    return "No information available"


def _judge(messages, params):
    text = messages[-1]["content"]
    gold = text.split("Gold answer: ")[1].split("\n")[0]
    pred = text.split("Generated answer: ")[1].split("\n")[0]
    return json.dumps({"label": "CORRECT" if gold.lower() in pred.lower() else "WRONG"})


def test_batching_one_embed_one_answer_one_judge_call_and_warm_cache_costs_nothing():
    before = bank_with(1, episodic=[DOG])
    q = [qa("What is the name of the dog Alice adopted?", "Biscuit"), qa("What is Bob's job?", "airline pilot")]
    samples = make_samples(before, 2, {"semantic": ops(PILOT)}, q) * 2
    comps = [EMPTY["core"], ops("2023-05-02: Alice bought a leash"), EMPTY["semantic"], EMPTY["procedural"],
             EMPTY["core"], '{"operations": [{"action": "DELETE", "id": "E1"}]}', ops(PILOT), "{oops"]
    answer_inner, judge_inner = CountingBackend(_answer), CountingBackend(_judge)
    cache = ResponseCache(":memory:")
    emb = HashEmbedder(512)
    r = SessionReward(SessionRewardConfig(judge="llm"), embedder=emb, tokenizer=WordTokenizer(),
                      answer_backend=CachedBackend(answer_inner, cache), judge_backend=CachedBackend(judge_inner, cache),
                      answer_params=GenerationParams(max_new_tokens=16))
    out = r(samples, comps)
    assert emb.calls == 1 and r.last_stats["embed_calls"] == 1
    assert answer_inner.generate_calls == 1 and judge_inner.generate_calls == 1
    # rows 0, 3, 4 and 6 rebuild the expert's bank (their output equals the expert's): scored once;
    # row 1 adds a leash, row 2 drops the pilot fact, row 5 deletes the dog memory, row 7 is invalid
    assert r.last_stats["unique_banks"] == 4
    assert r.last_stats["answer_prompts"] == r.last_stats["judge_prompts"] == 8
    assert [b.gate for b in out] == [1, 1, 1, 1, 1, 1, 1, 0]
    assert [b.acc for b in out] == [1.0, 1.0, 0.5, 1.0, 1.0, 0.5, 1.0, 0.0]
    assert out[2].correct == [True, False] and out[5].correct == [False, True]
    calls = (answer_inner.calls, judge_inner.calls)
    again = r(samples, comps)
    assert (answer_inner.calls, judge_inner.calls) == calls  # warm cache: zero model calls
    assert [b.reward for b in again] == [b.reward for b in out]


def test_missing_backend_and_bad_config_are_clear_errors():
    with pytest.raises(ValueError, match="answer_backend"):
        SessionReward(SessionRewardConfig(judge="f1"), embedder=HashEmbedder(), tokenizer=WordTokenizer())
    with pytest.raises(ValueError, match="judge backend"):
        SessionReward(SessionRewardConfig(judge="llm"), embedder=HashEmbedder(), tokenizer=WordTokenizer(),
                      answer_backend=ScriptedBackend(["x"]))
    with pytest.raises(ValueError, match="SessionRewardConfig.mode"):
        SessionRewardConfig(mode="sparse")
    with pytest.raises(ValueError, match="SessionRewardConfig.band_lo"):
        SessionRewardConfig(band_lo=1.5)
    s = make_samples(MemoryBank(), 1, {}, [], managers=["core"])
    with pytest.raises(ValueError, match="has no QA"):
        reward()(s, [EMPTY["core"]])
    with pytest.raises(ValueError, match="1 samples but 2 completions"):
        reward()(make_samples(MemoryBank(), 1, {}, [qa("q?", "a")], managers=["core"]), ["a", "b"])


def test_frac_reward_zero_std():
    assert frac_reward_zero_std([0.5, 0.5, 0.1, 0.9, 0.0, 0.0], 2) == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="groups of 4"):
        frac_reward_zero_std([1.0] * 6, 4)


def test_session_reward_counts_unparsable_judge_replies_and_empty_answers():
    from memgym.rewards.session_reward import SessionReward, SessionRewardConfig
    from tests.helpers import DOG, WordTokenizer, bank_with, make_samples, qa

    samples = make_samples(bank_with(1, episodic=[DOG]), 2, {},
                           [qa("What is the name of the dog Alice adopted?", "Biscuit"), qa("Who?", "Alice")],
                           managers=["episodic"])
    reward = SessionReward(SessionRewardConfig(judge="llm"), embedder=HashEmbedder(512), tokenizer=WordTokenizer(),
                           answer_backend=ScriptedBackend(["", "Alice"]), judge_backend=ScriptedBackend(["CORRECT"] * 2))
    (b,) = reward(samples, ['{"operations": []}'])
    assert b.acc == 0.0 and reward.last_stats["judge_unparsable"] == 2 and reward.last_stats["empty_answers"] == 1




def test_session_reward_gates_truncated_completions():
    from memgym.rewards.samples import RewardSample, sample_key
    from memgym.rewards.session_reward import SessionReward, SessionRewardConfig
    from memgym.memory_bank.schema import QAItem
    from memgym.llm.embeddings import HashEmbedder

    class WordTok:
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [t.split() for t in texts]}

    empty = {"core": '{"operation": "NONE"}', "episodic": '{"operations": []}', "semantic": '{"operations": []}',
             "procedural": '{"operations": []}'}
    q = QAItem("q", "Where did A go?", "park", ("D1:1",), "single-session")
    s = RewardSample(sample_key("c", 1, "episodic"), "c", 1, "episodic", [{"role": "user", "content": "x"}],
                     empty, MemoryBank(), [q])
    reward = SessionReward(SessionRewardConfig(), embedder=HashEmbedder(64), tokenizer=WordTok())
    good = '{"operations": [{"action": "ADD", "memory": "2023-05-08: A went to the park"}]}'
    a, b, c = reward([s, s, s], [good, good, CUT], finish_reasons=["stop", "length", None])
    assert (a.gate, a.reward) == (1, 1.0)
    assert (b.gate, b.reward, b.error_type) == (0, 0.0, "truncated")
    assert (c.gate, c.reward, c.error_type) == (0, 0.0, "truncated")
