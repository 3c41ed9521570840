"""Official judges behind the scorer interface (scripted backends), the one summary per
dataset (BEAM per chat then over chats, LongMemEval task-averaged vs overall over judged
questions, missing predictions), unreadable replies never cached, rubric-recall."""
from __future__ import annotations

import json
import math

import pytest

from memgym.llm.base import GenerationParams
from memgym.llm.cache import CachedBackend, ResponseCache
from memgym.memory_bank.schema import QAItem
from memgym.rewards.scoring.beam_judge import rubric_recall
from memgym.rewards.scoring.judge import ScoreItem
from memgym.rewards.scoring.official import BeamScorer, LoCoMoJudgeScorer, LongMemEvalScorer, RubricRecallScorer, judge_stats
from memgym.rewards.scoring.scorers import make_scorer
from memgym.rewards.scoring.summary import QuestionResult, summarise
from tests.helpers import ScriptedBackend


def test_beam_official_int_and_unreadable_counted_without_retry():
    replies = iter(['{"score": "1"}', "I think it is fine", '{"score": 0.5}'])
    backend = ScriptedBackend(lambda m, p: next(replies))
    scorer = BeamScorer(backend)
    out = scorer.score([ScoreItem("Q1?", "gold", "resp", "", "knowledge_update", "c:knowledge_update:1",
                                  ("a", "b", "c"))])
    # item a -> int("1") = 1; item b unreadable -> 0 (no retry); item c -> int(0.5) = 0
    assert out == [pytest.approx(1 / 3)]
    st = judge_stats(scorer)
    assert (st["prompts"], st["retries"], st["unreadable"]) == (3, 0, 1) and len(backend.seen) == 3
    assert [c["readable"] for c in scorer.last[0].calls] == [True, False, True]
    assert "<question>" in backend.seen[0][0][0]["content"]  # official: never filled in


def _row(conv: str, qid: str, category: str, capability: str | None, score: float | None) -> QuestionResult:
    """A judged question (``score`` None: missing)."""
    return QuestionResult(conv, QAItem(qid, "q", "a", category=category), capability, None, score, score is None)


def test_beam_summary_per_chat_then_over_chats():
    rows = [_row(c, i, cat, cap, sc) for c, i, cat, cap, sc in [
        ("a", "1", "abstention", "A", 1.0), ("a", "2", "abstention", "A", 0.0), ("b", "3", "abstention", "A", 1.0),
        ("a", "4", "event_ordering", "T", 0.25), ("a", "5", "event_ordering", "T", math.nan),
        ("b", "6", "event_ordering", "T", None)]]
    h = summarise("beam", rows)
    assert h["by_ability"] == {"abstention": 0.75, "event_ordering": 0.25}
    assert h["overall"] == 0.5 and "mean of the BEAM abilities" in h["overall_note"]
    assert h["by_category"]["abstention"] == {"score": 2 / 3, "n": 3}  # pooled over questions
    assert (h["n"], h["judged"], h["missing"], h["undefined"]) == (6, 5, ["6"], 1)
    assert summarise("beam", rows, missing_as_wrong=True)["by_ability"]["event_ordering"] == 0.125


def test_longmemeval_summary_over_judged_questions():
    rows = [_row(x, x, t, None, s)
            for x, t, s in [("a", "multi-session", 1.0), ("b", "multi-session", 1.0), ("c", "multi-session", 0.0),
                            ("d_abs", "multi-session", 1.0), ("e", "temporal-reasoning", 0.0),
                            ("f_abs", "temporal-reasoning", 0.0), ("g", "temporal-reasoning", None)]]
    h = summarise("longmemeval", rows)
    assert h["by_type"] == {"multi-session": 0.75, "temporal-reasoning": 0.0}
    assert h["task_averaged"] == 0.375 and h["overall"] == 0.5
    assert h["abstention"] == 0.5 and h["n_abstention"] == 2 and (h["judged"], h["missing"]) == (6, ["g"])
    w = summarise("longmemeval", rows, missing_as_wrong=True)
    assert w["overall"] == pytest.approx(3 / 7) and w["missing_as_wrong"] is True


def test_make_scorer_picks_the_official_judge():
    b = ScriptedBackend(lambda m, p: "yes")
    assert isinstance(make_scorer("llm", b, dataset="longmemeval"), LongMemEvalScorer)
    assert isinstance(make_scorer("llm", b, dataset="beam", judge_protocol="corrected"), BeamScorer)
    assert isinstance(make_scorer("llm", b, dataset="locomo"), LoCoMoJudgeScorer)
    assert make_scorer("llm", b).__class__.__name__ == "LLMJudgeScorer"  # no dataset: memgym's training judge
    assert isinstance(make_scorer("rubric-recall"), RubricRecallScorer)
    with pytest.raises(ValueError, match="official protocol's request"):
        make_scorer("llm", b, dataset="locomo", judge_constrained=True)


def test_unreadable_replies_are_not_cached(tmp_path):
    """An unreadable reply is removed from the response cache: a fixed server is asked again."""
    cache = ResponseCache(tmp_path / "r.sqlite")
    broken = ScriptedBackend(lambda m, p: "garbage")
    scorer = make_scorer("llm", CachedBackend(broken, cache), dataset="locomo")
    item = ScoreItem("When?", "7 May 2023", "7 May", "", "2", "conv-26/q0")
    assert scorer.score([item]) == [0.0] and scorer.stats.unreadable == 1 and len(cache) == 0
    fixed = ScriptedBackend(lambda m, p: '{"label": "CORRECT"}')
    again = make_scorer("llm", CachedBackend(fixed, cache), dataset="locomo")
    assert again.score([item]) == [1.0] and len(fixed.seen) == 1 and len(cache) == 1
    third = ScriptedBackend(lambda m, p: "never asked")
    assert make_scorer("llm", CachedBackend(third, cache), dataset="locomo").score([item]) == [1.0]
    assert third.seen == []


def test_rubric_recall():
    rubric = ["LLM response should state: January 15, 2024", "LLM response should mention: the Writers Festival",
              "Modal bug fix"]
    # items 1 and 2 appear (punctuation is stripped: "writers'" = "writers"), "modal bug fix" does not
    assert rubric_recall(rubric, "We met on January 15, 2024 at the writers' festival.") == pytest.approx(2 / 3)
    assert rubric_recall(rubric, "January 15 2024; Writers Festival; modal bug fixes") == 1.0
    with pytest.raises(ValueError, match="no rubric"):
        RubricRecallScorer().score([ScoreItem("q", "a", "p", "c")])
    assert json.dumps(judge_stats(RubricRecallScorer())) == "null"
    assert GenerationParams().max_new_tokens == 256
