"""LLM judge, scorers and answering from memory, over a scripted stub backend."""
import pytest

from memgym.llm.base import Completion, GenerationParams, LLMError
from memgym.rewards.scoring.answer import (ANSWER_SYSTEM_PROMPT, answer_questions, clean_answer, strip_thinking,
                                    truncate_context)
from memgym.rewards.scoring.judge import (F1Scorer, JudgeVerdict, LLMJudge, LLMJudgeScorer, RecallScorer, ScoreItem, Scorer,
                                   parse_judge_label)
from memgym.rewards.scoring.scorers import make_scorer


class BatchScriptBackend:
    """Returns the scripted texts in order; counts generate calls (batches, unlike
    tests.helpers.ScriptedBackend, which counts prompts) and records each batch and params."""

    def __init__(self, outputs, model_id="stub", n_override=None):
        self.outputs = list(outputs)
        self.model_id = model_id
        self.calls = 0
        self.batches = []
        self.params = []
        self.n_override = n_override

    def generate(self, batch, params):
        self.calls += 1
        self.batches.append(batch)
        self.params.append(params)
        n = len(batch) if self.n_override is None else self.n_override
        texts, self.outputs = self.outputs[:n], self.outputs[n:]
        return [Completion(text=t) for t in texts]


# ---------------------------------------------------------------- judge


def test_judge_one_batched_call_and_tolerant_parsing():
    outputs = [
        '{"label": "CORRECT"}',
        '```json\n{"label": "wrong"}\n```',
        "I think it is CORRECT",  # no JSON object → WRONG, parse failure
        '<think>maybe {"label": "WRONG"}</think> Verdict: {"label": "CORRECT"}',
    ]
    be = BatchScriptBackend(outputs)
    items = [
        ("Where did Mel go?", "Paris", "She went to Paris"),
        ("When?", "7 May 2023", "June"),
        ("Who?", "Caroline", "Caroline"),
        ("What pet?", 3, "three dogs"),  # int gold is shown as text
    ]
    verdicts = LLMJudge(be).judge(items)
    assert verdicts == [
        JudgeVerdict(True, outputs[0], True),
        JudgeVerdict(False, outputs[1], True),
        JudgeVerdict(False, outputs[2], False),
        JudgeVerdict(True, outputs[3], True),
    ]
    assert be.calls == 1 and len(be.batches[0]) == 4
    assert be.params[0] == GenerationParams(max_new_tokens=64, temperature=0)
    user = be.batches[0][0][1]["content"]
    assert "Where did Mel go?" in user and "Gold answer: Paris" in user and "She went to Paris" in user
    assert "Gold answer: 3" in be.batches[0][3][1]["content"]


@pytest.mark.parametrize(
    "raw,label",
    [
        ('{"label": "CORRECT"}', "CORRECT"),
        ("{label: WRONG}", "WRONG"),
        ('Sure! {"Label": " correct "} hope that helps', "CORRECT"),
        ('[{"label": "WRONG"}]', "WRONG"),
        ('{"label": "CORRECT"', "CORRECT"),  # missing brace repaired
        ('{"label": "MAYBE"}', None),
        ('{"verdict": "CORRECT"}', None),
        ('{"label": 1}', None),
        ("CORRECT", None),
        ("", None),
        ("<think>still thinking {\"label\": \"CORRECT\"}", None),  # unclosed thinking
    ],
)
def test_parse_judge_label(raw, label):
    assert parse_judge_label(raw) == label


def test_judge_errors_and_empty():
    be = BatchScriptBackend([])
    judge = LLMJudge(be)
    assert judge.judge([]) == [] and be.calls == 0
    with pytest.raises(ValueError, match=r"items\[1\]"):
        judge.judge([("q", "a", "p"), ("q", "a")])
    with pytest.raises(TypeError, match=r"items\[0\]\.prediction"):
        judge.judge([("q", "a", None)])
    assert be.calls == 0  # bad input is refused before any model call
    short = BatchScriptBackend(['{"label": "CORRECT"}'], n_override=1)
    with pytest.raises(LLMError, match="1 completions for 2 prompts"):
        LLMJudge(short).judge([("q", "a", "p"), ("q2", "a2", "p2")])
    with pytest.raises(TypeError, match="Backend"):
        LLMJudge(object())


# ---------------------------------------------------------------- scorers


def test_f1_scorer_uses_category_rules():
    items = [
        ScoreItem("q", "London", "Paris and London", category="4"),  # 2/3
        ScoreItem("q", "London, Rome", "Paris and London", category=1),  # (2/3 + 0)/2
        ScoreItem("q", "Sweden; she moved", "Sweden", category="3"),  # 1
        ScoreItem("q", "", "Not mentioned.", category="5"),  # 1
        ScoreItem("q", "London, Rome", "Paris and London", category="multi-session"),  # plain: 1/2
        ScoreItem("q", 2022, "2022", category=None),  # int gold → "2022": 1
    ]
    scores = F1Scorer().score(items)
    assert scores == pytest.approx([2 / 3, 1 / 3, 1.0, 1.0, 0.5, 1.0])
    with pytest.raises(ValueError, match=r"items\[4\].*multi-session"):
        F1Scorer(strict=True).score(items)


def test_recall_scorer_ignores_prediction():
    items = [
        ScoreItem("q", "Paris and London", prediction="nothing", context="we saw London"),  # 1/2
        ScoreItem("q", "three blue cats", context="blue cat three"),  # 1
        ScoreItem("q", "Rome", context=""),  # 0
    ]
    assert RecallScorer().score(items) == pytest.approx([0.5, 1.0, 0.0])
    assert RecallScorer.needs_prediction is False


def test_llm_judge_scorer_and_failures():
    be = BatchScriptBackend(['{"label": "CORRECT"}', "garbage", '{"label": "WRONG"}'])
    scorer = LLMJudgeScorer(be)
    items = [ScoreItem("q1", "a", "a"), ScoreItem("q2", "b", "b"), ScoreItem("q3", "c", "d")]
    assert scorer.score(items) == [1.0, 0.0, 0.0]
    assert scorer.parse_failures == 1 and [v.parse_ok for v in scorer.last_verdicts] == [True, False, True]
    assert be.calls == 1
    with pytest.raises(TypeError, match=r"items\[0\] must be a ScoreItem"):
        scorer.score([("q", "a", "p")])


def test_score_item_validation():
    with pytest.raises(TypeError, match="ScoreItem.prediction"):
        ScoreItem("q", "a", None)
    with pytest.raises(TypeError, match="ScoreItem.category"):
        ScoreItem("q", "a", "p", category=1.5)
    assert ScoreItem("q", 7).gold == "7"


def test_make_scorer():
    assert isinstance(make_scorer("f1"), F1Scorer)
    assert isinstance(make_scorer("answer-recall"), RecallScorer)
    be = BatchScriptBackend([])
    s = make_scorer("llm", judge_backend=be, judge_params=GenerationParams(max_new_tokens=8))
    assert isinstance(s, LLMJudgeScorer) and s.judge.params.max_new_tokens == 8
    for sc in (make_scorer("f1"), make_scorer("answer-recall"), s):
        assert isinstance(sc, Scorer)
    with pytest.raises(ValueError, match="judge backend"):
        make_scorer("llm")
    with pytest.raises(ValueError, match="unknown scorer 'bleu'"):
        make_scorer("bleu")


# ---------------------------------------------------------------- answering


@pytest.mark.parametrize(
    "raw,answer",
    [
        ("Paris", "Paris"),
        ("Answer: Paris\nBecause she said so.", "Paris\nBecause she said so."),  # whole answers (issue 16)
        ("1. Setup\n\n2. Styling", "1. Setup\n\n2. Styling"),
        ("\n\n  **Final Answer:** 7 May 2023  \n", "7 May 2023"),
        ("<think>she said Rome?\nno</think>\nLondon", "London"),
        ('"No information available"', "No information available"),
        ("<think>never finished", ""),
        ("reasoning done</think>Berlin", "Berlin"),
        ("", ""),
    ],
)
def test_clean_answer(raw, answer):
    assert clean_answer(raw) == answer


def test_strip_thinking_keeps_text_outside_blocks():
    assert strip_thinking("a<thinking>x</thinking>b") == "ab"


def test_truncate_context():
    assert truncate_context("short", 10) == "short"
    assert truncate_context("abcdefghij", 4) == "abcd"
    # budget 12 keeps "line one\nlin"; newline at 8 ≥ 12 // 2 → cut back to "line one".
    assert truncate_context("line one\nline two", 12) == "line one"
    with pytest.raises(ValueError, match="max_chars"):
        truncate_context("x", 0)


def test_answer_questions_one_call_truncates_and_cleans():
    be = BatchScriptBackend(["Answer: Paris\nextra", "<think>hmm</think>No information available"])
    ctx = "E1 2023-05-07: Mel went to Paris\n" + "x" * 7000
    items = [("Where did Mel go?", ctx, "2023/05/30 (Tue) 23:40"), ("What is Bob's dog called?", "", None)]
    out = answer_questions(be, items)
    assert out == ["Paris\nextra", "No information available"]  # the whole answer is judged (issue 16)
    assert be.calls == 1 and be.params[0] == GenerationParams(max_new_tokens=48, temperature=0)
    system, user = be.batches[0][0]
    assert system == {"role": "system", "content": ANSWER_SYSTEM_PROMPT}
    assert "No information available" in system["content"]
    # "E1 2023-05-07: Mel went to Paris" is 32 characters, so the only newline is at index
    # 32 < 6000 // 2 and the cut is the plain 6000-character head: 32 + 1 + 5967 x's.
    assert "x" * 5967 in user["content"] and "x" * 5968 not in user["content"]
    assert "Current date: 2023/05/30 (Tue) 23:40" in user["content"]
    assert "Question: Where did Mel go?" in user["content"]
    assert "Current date" not in be.batches[0][1][1]["content"]


def test_answer_questions_errors():
    be = BatchScriptBackend([])
    assert answer_questions(be, []) == [] and be.calls == 0
    with pytest.raises(ValueError, match=r"items\[1\]\.question"):
        answer_questions(be, [("q", "c", None), ("  ", "c", None)])
    with pytest.raises(TypeError, match=r"items\[0\]\.question_date"):
        answer_questions(be, [("q", "c", 20230530)])
    assert be.calls == 0
    with pytest.raises(LLMError, match="0 completions for 1 prompts"):
        answer_questions(BatchScriptBackend([], n_override=0), [("q", "c", None)])


def test_beam_answers_are_asked_whole():
    """BEAM's lists and summaries: the answer prompt asks for them whole (issue 16)."""
    from memgym.rewards.scoring.answer import BEAM_ANSWER_SYSTEM_PROMPT, answer_system_prompt

    assert answer_system_prompt("beam") == BEAM_ANSWER_SYSTEM_PROMPT and answer_system_prompt("locomo") == \
        ANSWER_SYSTEM_PROMPT
    be = BatchScriptBackend(["1. Setup\n2. Styling"])
    out = answer_questions(be, [("In what order?", "notes", None)], system_prompt=answer_system_prompt("beam"))
    assert out == ["1. Setup\n2. Styling"] and be.batches[0][0][0]["content"] == BEAM_ANSWER_SYSTEM_PROMPT
    assert "one item per line" in BEAM_ANSWER_SYSTEM_PROMPT
