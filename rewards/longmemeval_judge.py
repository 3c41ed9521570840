"""LongMemEval's official judge: one yes/no prompt per question type, and its headline numbers.

Source: ``../shared/data/README.md`` § "LongMemEval schema" (the rules of
``src/evaluation/evaluate_qa.py`` of xiaowu0162/LongMemEval, MIT; the official judge is
gpt-4o-2024-08-06 at temperature 0 with at most 10 tokens). The prompts are memgym's own
wording with the same rules:

- single-session-user, single-session-assistant, multi-session: yes if the response contains
  the correct answer, is equivalent to it, or gives all the intermediate steps to it; a response
  with only a subset of the required information is no.
- temporal-reasoning: the same, and off-by-one errors in counts of days, weeks or months are
  not penalised.
- knowledge-update: yes if the response gives the updated answer, even when it also mentions
  older information.
- single-session-preference: the reference is a rubric of a personalised response; yes if the
  response recalls and uses the user's information correctly (it need not cover every point).
- abstention (any id containing ``_abs``, whatever its type): yes if the response says the
  question cannot be answered from the history.

The label is yes when the reply says "yes" (the official rule is ``'yes' in reply.lower()``);
a reply with neither a "yes" nor a "no" word is unparsable (retried once, then 0).
Reported: task-averaged accuracy (mean of the per-type accuracies, ``_abs`` items staying in
their type), overall accuracy (mean over questions) and abstention accuracy (``_abs`` only).
"""
from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Sequence

from data_synth.capabilities import LONGMEMEVAL_MAP
from llm.base import Backend, GenerationParams
from rewards.answer import strip_thinking
from rewards.judge_calls import JudgeStats, judge_batch

__all__ = ["LONGMEMEVAL_TYPES", "longmemeval_prompt", "parse_yes_no", "LongMemEvalJudge", "longmemeval_headline"]

LONGMEMEVAL_TYPES: tuple[str, ...] = tuple(LONGMEMEVAL_MAP)

_INTRO = ("You check a model's answer to a question about a user's chat history. You get the question, the "
          "correct answer and the model's response. ")
_CORRECT = ("Say yes if the response contains the correct answer, or is equivalent to it, or contains all the "
            "intermediate steps that lead to it. Say no if the response gives only part of the information the "
            "answer needs, or a different answer.")
_RULES = {
    "single-session-user": _CORRECT,
    "single-session-assistant": _CORRECT,
    "multi-session": _CORRECT,
    "temporal-reasoning": _CORRECT + (
        " Do not penalise off-by-one errors in a number of days, weeks or months: if the question asks how many "
        "days (weeks, months, ...) and the response is off by one (say 19 days where the answer is 18), it is "
        "still correct."),
    "knowledge-update": _CORRECT + (
        " The user's information may have changed over time: if the response mentions older information as well "
        "as the updated answer, it is correct as long as the updated answer is the one required."),
}
_PREFERENCE = ("You check a model's response to a user's request. You get the request, a rubric describing what a "
               "personalised response does, and the model's response. Say yes if the response satisfies the rubric: "
               "it need not cover every point of the rubric; it is correct as long as it recalls and uses the "
               "user's personal information correctly. Otherwise say no.")
_ABSTENTION = ("You check a model's response to a question that cannot be answered from the user's chat history. "
               "You get the question, an explanation of why it is unanswerable, and the model's response. Say yes "
               "if the response identifies the question as unanswerable: it may say that the information is "
               "missing or incomplete, or that related information was given but not the information asked for. "
               "Say no if it gives an answer as if it were known.")
_ASK = "\n\nReply with one word: yes or no."
RETRY_NOTE = "Your reply could not be read. Reply with exactly one word: yes or no."


def longmemeval_prompt(question_type: str, question: str, answer: str, response: str,
                       question_id: str | None = None) -> list[dict]:
    """The judge messages for one question (system: the type's rule; user: the three texts).

    An id containing ``_abs`` gets the abstention prompt whatever ``question_type`` is.

    Raises:
        ValueError: ``question_type`` is not one of the six LongMemEval types.
    """
    if question_type not in LONGMEMEVAL_TYPES:
        raise ValueError(f"unknown LongMemEval question type {question_type!r}; expected one of "
                         f"{', '.join(LONGMEMEVAL_TYPES)}")
    if question_id is not None and "_abs" in question_id:
        system, ref = _ABSTENTION, "Explanation"
    elif question_type == "single-session-preference":
        system, ref = _PREFERENCE, "Rubric"
    else:
        system, ref = _INTRO + _RULES[question_type], "Correct answer"
    user = f"Question: {question}\n\n{ref}: {answer}\n\nModel response: {response}\n\nIs the model response correct?"
    return [{"role": "system", "content": system + _ASK}, {"role": "user", "content": user}]


_YES = re.compile(r"\byes\b", re.IGNORECASE)
_NO = re.compile(r"\bno\b", re.IGNORECASE)


def parse_yes_no(raw: str) -> bool | None:
    """True if the reply (thinking blocks dropped) contains the word "yes", False if it
    contains "no" but not "yes", None if neither (unparsable)."""
    if not isinstance(raw, str):
        return None
    text = strip_thinking(raw)
    if _YES.search(text):
        return True
    if _NO.search(text):
        return False
    return None


class LongMemEvalJudge:
    """The official LongMemEval judge behind any backend: one batched call per
    :meth:`judge` (plus one for retries). ``stats`` accumulates :class:`JudgeStats`."""

    def __init__(self, backend: Backend, params: GenerationParams | None = None):
        self.backend = backend
        self.params = params or GenerationParams(max_new_tokens=10, temperature=0)
        self.stats = JudgeStats()

    def judge(self, items: Sequence[tuple[str, str, str, str, str | None]]) -> list[float]:
        """Score ``(question_type, question, answer, response, question_id)`` tuples: 1.0 yes,
        0.0 no or unparsable after the retry. Raises ValueError for an unknown type (before any
        model call)."""
        prompts = [longmemeval_prompt(t, q, a, r, qid) for t, q, a, r, qid in items]
        labels = judge_batch(self.backend, prompts, parse_yes_no, self.params, RETRY_NOTE, self.stats)
        return [1.0 if v else 0.0 for v in labels]


def longmemeval_headline(rows: Sequence[dict]) -> dict:
    """LongMemEval's reported numbers from ``rows`` of ``{"id", "category", "score"}``
    (category = question type, score in [0, 1]).

    Returns ``{"task_averaged_accuracy", "overall_accuracy", "abstention_accuracy",
    "by_type": {type: accuracy}, "n", "n_abstention"}``: task-averaged = the mean of the
    per-type accuracies over the types present (``_abs`` items stay in their type); overall =
    the mean over all rows; abstention = the mean over ``_abs`` ids (None when there are none).
    """
    by_type: dict[str, list[float]] = defaultdict(list)
    abst = []
    for r in rows:
        by_type[str(r["category"])].append(float(r["score"]))
        if "_abs" in str(r["id"]):
            abst.append(float(r["score"]))
    per_type = {t: sum(v) / len(v) for t, v in sorted(by_type.items())}
    n = sum(len(v) for v in by_type.values())
    return {
        "task_averaged_accuracy": sum(per_type.values()) / len(per_type) if per_type else 0.0,
        "overall_accuracy": sum(sum(v) for v in by_type.values()) / n if n else 0.0,
        "abstention_accuracy": sum(abst) / len(abst) if abst else None,
        "by_type": per_type,
        "n": n,
        "n_abstention": len(abst),
    }
