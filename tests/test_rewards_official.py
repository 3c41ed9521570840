"""Official judges with scripted judge backends: BEAM rubric judge (question in every prompt,
partial credit, string scores, retry accounting), Kendall tau-b event ordering, LongMemEval
per-type prompts and its headline numbers, rubric-recall."""
from __future__ import annotations

import json

import pytest

from rewards.beam_judge import (BeamItem, BeamJudge, beam_headline, kendall_tau_b_normalised, order_score,
                                parse_rubric_score, rubric_recall)
from rewards.judge import ScoreItem, make_scorer
from rewards.longmemeval_judge import LongMemEvalJudge, longmemeval_headline, parse_yes_no
from rewards.official import BeamScorer, LongMemEvalScorer, RubricRecallScorer, judge_stats
from tests.helpers import ScriptedBackend


def _user(messages):
    return next(m["content"] for m in messages if m["role"] == "user")


def test_beam_rubric_prompt_has_question_and_item_partial_credit_kept():
    judge_backend = ScriptedBackend(lambda m, p: '{"score": 0.5, "reason": "partly"}')
    items = [BeamItem("information_extraction", "When did I meet Michael?", ("states January 15, 2024",
                                                                          "names the festival"), "In January."),
             BeamItem("summarization", "Summarise my writing journey.", ("mentions Grammarly",), "You wrote.")]
    scores = BeamJudge(judge_backend).score(items)
    assert scores == [0.5, 0.5]  # int() would have made these 0
    assert len(judge_backend.seen) == 3
    for (msgs, _), (q, item) in zip(judge_backend.seen, [(items[0].question, items[0].rubric[0]),
                                                         (items[0].question, items[0].rubric[1]),
                                                         (items[1].question, items[1].rubric[0])]):
        assert q in _user(msgs) and item in _user(msgs)


def test_beam_string_score_and_unparsable_retried_then_counted():
    assert parse_rubric_score('{"score": "0.5", "reason": "x"}') == 0.5
    assert parse_rubric_score('```json\n{"score": 1}\n```') == 1.0
    assert parse_rubric_score('{"score": 2}') is None and parse_rubric_score("full credit") is None
    replies = iter(['{"score": "1.0"}', "I think it is fine", '{"score": 0}', "still prose"])
    backend = ScriptedBackend(lambda m, p: next(replies))
    scorer = BeamScorer(backend)
    out = scorer.score([ScoreItem("Q1?", "gold", "resp", "", "knowledge_update", "c:knowledge_update:1",
                                  ("a", "b", "c"))])
    # item a -> 1.0; item b unparsable -> retried -> "still prose" -> 0 ; item c -> 0.0
    assert out == [pytest.approx(1 / 3)]
    st = judge_stats(scorer)
    assert (st["prompts"], st["retried"], st["unparsable"]) == (3, 1, 1)
    retry_msgs = backend.seen[-1][0]
    assert retry_msgs[-2] == {"role": "assistant", "content": "I think it is fine"}
    assert "could not be read" in retry_msgs[-1]["content"]


def test_kendall_tau_hand_values():
    assert kendall_tau_b_normalised([0, 1, 2, 3], [0, 1, 2, 3]) == 1.0
    assert kendall_tau_b_normalised([0, 1, 2, 3], [3, 2, 1, 0]) == 0.0
    # one adjacent swap of 4: 5 concordant, 1 discordant pairs: tau = 4/6, normalised 5/6
    assert kendall_tau_b_normalised([0, 1, 2, 3], [1, 0, 2, 3]) == pytest.approx(5 / 6)
    # item 1 unmatched ranks last: response ranks [0, 2, 1] -> tau 1/3 -> 2/3
    assert order_score(3, [0, None, 2]) == pytest.approx(2 / 3)
    assert order_score(3, [None, None]) == 0.0


def test_event_ordering_by_line_alignment():
    rubric = ("setup", "styling", "bug fix")
    def same(messages, params):
        u = _user(messages)
        line = u.split("Response line: ")[1].split("\n")[0]
        item = u.split("Reference item: ")[1].split("\n")[0]
        return "yes" if item.split()[0] in line else "no"
    backend = ScriptedBackend(same)
    resp = "1) styling first\n\n2) then setup\n3) finally bug work"
    [s] = BeamJudge(backend).score([BeamItem("event_ordering", "Order?", rubric, resp)])
    # lines match styling, setup, bug: ranks [1, 0, 2] vs [0, 1, 2] -> tau 1/3 -> 2/3
    assert s == pytest.approx(2 / 3)
    assert len(backend.seen) == 9 and all("Order?" in _user(m) for m, _ in backend.seen)


def test_beam_headline_per_chat_then_over_chats():
    rows = [{"conversation": "a", "category": "abstention", "score": 1.0},
            {"conversation": "a", "category": "abstention", "score": 0.0},
            {"conversation": "b", "category": "abstention", "score": 1.0},
            {"conversation": "a", "category": "event_ordering", "score": 0.25}]
    h = beam_headline(rows)
    assert h["by_ability"] == {"abstention": 0.75, "event_ordering": 0.25}
    assert h["overall"] == 0.5 and "mean of the 10 BEAM abilities" in h["note"]


def test_longmemeval_each_type_gets_its_rule():
    backend = ScriptedBackend(lambda m, p: "Yes.")
    judge = LongMemEvalJudge(backend)
    types = ["single-session-user", "temporal-reasoning", "knowledge-update", "single-session-preference",
             "multi-session"]
    items = [(t, "Q?", "A", "R", f"q{i}") for i, t in enumerate(types)] + [("temporal-reasoning", "Q?", "A", "R",
                                                                           "q9_abs")]
    assert judge.judge(items) == [1.0] * 6
    systems = [m[0]["content"] for m, _ in backend.seen]
    assert "off-by-one" in systems[1] and "off-by-one" not in systems[0]
    assert "updated answer" in systems[2]
    assert "rubric" in systems[3] and "personal information" in systems[3]
    assert "cannot be answered" in systems[5] and "off-by-one" not in systems[5]
    assert "Explanation:" in _user(backend.seen[5][0]) and "Rubric:" in _user(backend.seen[3][0])
    assert backend.seen[0][1].max_new_tokens == 10 and backend.seen[0][1].temperature == 0
    assert parse_yes_no("No, it is wrong") is False and parse_yes_no("maybe") is None


def test_longmemeval_task_averaged_vs_overall():
    rows = [{"id": "a", "category": "multi-session", "score": 1.0},
            {"id": "b", "category": "multi-session", "score": 1.0},
            {"id": "c", "category": "multi-session", "score": 0.0},
            {"id": "d_abs", "category": "multi-session", "score": 1.0},
            {"id": "e", "category": "temporal-reasoning", "score": 0.0},
            {"id": "f_abs", "category": "temporal-reasoning", "score": 0.0}]
    h = longmemeval_headline(rows)
    assert h["by_type"] == {"multi-session": 0.75, "temporal-reasoning": 0.0}
    assert h["task_averaged_accuracy"] == 0.375 and h["overall_accuracy"] == 0.5
    assert h["abstention_accuracy"] == 0.5 and h["n_abstention"] == 2


def test_make_scorer_picks_the_official_judge():
    b = ScriptedBackend(lambda m, p: "yes")
    assert isinstance(make_scorer("llm", b, dataset="longmemeval"), LongMemEvalScorer)
    assert isinstance(make_scorer("llm", b, dataset="beam"), BeamScorer)
    assert make_scorer("llm", b, dataset="locomo").__class__.__name__ == "LLMJudgeScorer"
    assert isinstance(make_scorer("rubric-recall"), RubricRecallScorer)


def test_rubric_recall():
    rubric = ["LLM response should state: January 15, 2024", "LLM response should mention: the Writers Festival",
              "Modal bug fix"]
    # items 1 and 2 appear (punctuation is stripped: "writers'" = "writers"), "modal bug fix" does not
    assert rubric_recall(rubric, "We met on January 15, 2024 at the writers' festival.") == pytest.approx(2 / 3)
    assert rubric_recall(rubric, "January 15 2024; Writers Festival; modal bug fixes") == 1.0
    with pytest.raises(ValueError, match="no rubric"):
        RubricRecallScorer().score([ScoreItem("q", "a", "p", "c")])
    assert json.dumps(judge_stats(RubricRecallScorer())) == "null"
