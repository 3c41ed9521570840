"""The verbatim-copy rate (:mod:`memgym.rewards.copying`) and its optional price in the session reward."""
from __future__ import annotations

import json

import pytest

from memgym.llm.embeddings import HashEmbedder
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.prompts import build_prompt
from memgym.rewards.copying import copy_rate, prompt_transcript, words
from memgym.rewards.reward_types import RewardDataError
from memgym.rewards.samples import RewardSample, sample_key
from memgym.rewards.session_reward import SessionReward, SessionRewardConfig
from tests.helpers import EMPTY, WordTokenizer, conversation, make_samples, qa

COPIED = "Caroline: Caroline went to the LGBTQ support group. She enjoyed it."  # 11 words, first 8 copied
DISTILLED = "Caroline attends an LGBTQ support group."  # 6 words, no 6-gram of the transcript


def test_copy_rate_hand_counted():
    src = "a b c d e f g h"
    assert copy_rate("x a b c d e f y", src) == pytest.approx(6 / 8)  # one shared 6-gram covers 6 of 8 words
    assert copy_rate("x a b c d e f y", src, n=7) == 0.0
    assert copy_rate("a b c d e f g h", src) == 1.0
    assert copy_rate("c d e f g h a b c d e f", src) == 1.0  # two overlapping copies cover every word
    # case and punctuation are ignored: words are lower-cased \w+ runs
    assert words("Nate: Playing video-games!") == ["nate", "playing", "video", "games"]
    assert copy_rate("Nate: playing video games and watching movies",
                     "[D1:3] nate playing VIDEO games, and watching movies are fun") == 1.0
    assert copy_rate("Nate enjoys gaming and films at home", "Nate: playing video games and watching movies") == 0.0
    assert copy_rate("a b c", "a b c") == 0.0  # shorter than n words: never counted as a copy
    assert copy_rate("", src) == 0.0
    # several sources; repetition loops count from their second occurrence on
    assert copy_rate("x a b c d e f y", ["q r", src]) == pytest.approx(6 / 8)
    assert copy_rate(" ".join(["nate"] * 10), "") == pytest.approx(9 / 10)  # every word but the first
    assert copy_rate(" ".join(["nate"] * 10), "", self_repeats=False) == 0.0
    assert copy_rate("p q r s t u v p q r s t u", "") == pytest.approx(6 / 13)  # the repeated 6-gram only
    with pytest.raises(ValueError, match="n must be an int >= 2"):
        copy_rate("a b", "a b", n=1)
    with pytest.raises(TypeError, match="expected a str"):
        copy_rate(None, src)


def test_prompt_transcript_inverts_build_prompt():
    session = conversation().sessions[0]
    for manager in ("core", "episodic"):
        msgs = build_prompt(manager, MemoryBank(), session).messages
        assert prompt_transcript(msgs) == session.transcript()
    with pytest.raises(ValueError, match="no user message with a 'New session transcript:' section"):
        prompt_transcript([{"role": "user", "content": "x"}])


def _core_sample():
    conv = conversation()
    session = conv.sessions[0]
    bank = MemoryBank()
    return RewardSample(sample_key("c", 1, "core"), "c", 1, "core", build_prompt("core", bank, session).messages,
                        dict(EMPTY), bank, [conv.questions[0]])  # "What did Caroline go to?" -> "LGBTQ support group"


def _bank_with_core(text: str) -> MemoryBank:
    bank = MemoryBank()
    bank.apply_text("core", json.dumps({"operation": "APPEND", "content": text}), 0)
    return bank


def _reward(**cfg):
    return SessionReward(SessionRewardConfig(**cfg), embedder=HashEmbedder(512), tokenizer=WordTokenizer())


def test_copy_penalty_prices_copied_core_text():
    """R = g·acc·(1 - λ·LP)·(1 - μ·CP): both outputs answer the question (acc 1, LP 0 at 11 words);
    the copied one has CP 8/11, so μ = 1 gives 3/11 and μ = 0.5 gives 7/11; off (μ = 0, the
    default, MemBuilder's reward) it scores 1 and its CP is still logged."""
    s = _core_sample()
    copied = json.dumps({"operation": "APPEND", "content": COPIED})
    distilled = json.dumps({"operation": "APPEND", "content": DISTILLED})
    off = _reward()([s, s], [copied, distilled])
    assert [(b.acc, b.lp, b.reward) for b in off] == [(1.0, 0.0, 1.0), (1.0, 0.0, 1.0)]
    assert off[0].copy == pytest.approx(8 / 11) and off[1].copy == 0.0
    assert off[0].to_log()["copy"] == pytest.approx(8 / 11)
    for mu, want in ((1.0, 3 / 11), (0.5, 7 / 11)):
        c, d = _reward(copy_penalty=mu)([s, s], [copied, distilled])
        assert c.reward == pytest.approx(want) and d.reward == 1.0
    # APPEND of text already in the core block duplicates it: copied; a REWRITE may restate it
    block = "Caroline likes long walks with her two dogs at the beach"  # 11 words, no 6-gram of the transcript
    s2 = RewardSample(s.key, "c", 1, "core", s.messages, dict(EMPTY), _bank_with_core(block), s.qa)
    app, rew = _reward()([s2, s2], [json.dumps({"operation": op, "content": block + " daily"})
                                    for op in ("APPEND", "REWRITE")])
    assert (app.copy, rew.copy) == (pytest.approx(11 / 12), 0.0)
    # a NONE writes nothing (CP 0); an invalid output is gated to 0 with CP 0
    n, bad = _reward(copy_penalty=1.0)([s, s], ['{"operation": "NONE"}', '{"operation": "APPEND"'])
    assert (n.copy, bad.copy, bad.gate, bad.reward) == (0.0, 0.0, 0, 0.0)


def test_copy_penalty_needs_the_transcript_and_checks_its_range():
    samples = make_samples(MemoryBank(), 1, {}, [qa("What did Caroline go to?", "LGBTQ support group")],
                           managers=["core"])  # prompt "x": no transcript section
    out = json.dumps({"operation": "APPEND", "content": COPIED})
    (b,) = _reward()(samples, [out])
    assert b.copy == 0.0  # off: nothing to price, nothing raised
    with pytest.raises(RewardDataError, match="c1/s1/core: copy_penalty 1.0 needs the session transcript"):
        _reward(copy_penalty=1.0)(samples, [out])
    with pytest.raises(ValueError, match=r"SessionRewardConfig\.copy_penalty must be in \[0, 1\], got 1.5"):
        SessionRewardConfig(copy_penalty=1.5)
    with pytest.raises(ValueError, match=r"SessionRewardConfig\.copy_ngram must be an int >= 2, got 1"):
        SessionRewardConfig(copy_ngram=1)
