"""memgym's own CORRECT/WRONG LLM judge (training rewards on synthetic QA, never a benchmark
number) and the interchangeable scorers; scores are floats in [0, 1].
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import json_repair

from memgym.llm.base import Backend, GenerationParams, LLMError
from memgym.llm.structured import JsonSchema
from memgym.rewards.scoring.answer import check_triples, strip_thinking
from memgym.rewards.scoring.metrics import LOCOMO_CATEGORIES, answer_recall, f1_score, locomo_f1

__all__ = ["JUDGE_SYSTEM_PROMPT", "JUDGE_SCHEMA", "JudgeVerdict", "LLMJudge", "parse_judge_label", "ScoreItem",
           "Scorer", "F1Scorer", "RecallScorer", "LLMJudgeScorer", "check_score_items"]

JUDGE_SYSTEM_PROMPT = (
    "You grade answers to questions about a long conversation. You get a question, the gold "
    "answer and a generated answer. Be generous: the generated answer is CORRECT if it refers "
    "to the same fact, entity, event or topic as the gold answer, even when it is longer, "
    "worded differently or adds harmless detail. A date or time is CORRECT if it denotes the "
    "same day, month or period as the gold one, in any format (e.g. '7 May 2023', "
    "'2023-05-07', 'the Sunday before 8 May 2023'). The answer is WRONG if it states a "
    "different fact, misses the point of the gold answer, or declines to answer when a gold "
    "answer exists.\n"
    'Reply with exactly one JSON object and nothing else: {"label": "CORRECT"} or {"label": "WRONG"}'
)

_LABELS = ("CORRECT", "WRONG")

#: The judge's reply schema (``{"label": "CORRECT" | "WRONG"}``), for constrained judging.
JUDGE_SCHEMA = JsonSchema("judge_verdict", {
    "type": "object", "properties": {"label": {"type": "string", "enum": list(_LABELS)}},
    "required": ["label"], "additionalProperties": False})


@dataclass(frozen=True)
class JudgeVerdict:
    """One judge decision. ``correct`` is True only for a parsed CORRECT label; ``raw`` is
    the model's text as returned; ``parse_ok`` is False when no valid label was found (the
    verdict is then WRONG)."""

    correct: bool
    raw: str
    parse_ok: bool


def parse_judge_label(raw: str) -> str | None:
    """"CORRECT" / "WRONG" from a judge output (thinking dropped, ``json_repair``-parsed, the first
    object with a ``label`` key), or None; a bare word without JSON is not accepted.
    """
    if not isinstance(raw, str):
        return None
    text = strip_thinking(raw).strip()
    if not text:
        return None
    try:
        parsed = json_repair.loads(text)
    except Exception:  # json_repair is best-effort; any failure means "no label"
        return None
    objects = parsed if isinstance(parsed, list) else [parsed]
    for obj in objects:
        if not isinstance(obj, dict):
            continue
        for key, value in obj.items():
            if isinstance(key, str) and key.strip().lower() == "label":
                label = value.strip().upper() if isinstance(value, str) else None
                return label if label in _LABELS else None
    return None


def _judge_messages(question: str, gold: str, prediction: str) -> list[dict]:
    user = (
        f"Question: {question}\n"
        f"Gold answer: {gold}\n"
        f"Generated answer: {prediction}\n\n"
        'Is the generated answer correct? Reply {"label": "CORRECT"} or {"label": "WRONG"}.'
    )
    return [{"role": "system", "content": JUDGE_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def _check_judge_items(items) -> list[tuple[str, str, str]]:
    out = []
    for i, (q, gold, pred) in enumerate(check_triples(items, ("question", "gold", "prediction"))):
        if not isinstance(q, str):
            raise TypeError(f"items[{i}].question must be a str, got {type(q).__name__}")
        if isinstance(gold, bool) or not isinstance(gold, (str, int)):
            raise TypeError(f"items[{i}].gold must be a str or int, got {type(gold).__name__}")
        if not isinstance(pred, str):
            raise TypeError(f"items[{i}].prediction must be a str, got {type(pred).__name__}")
        out.append((q, str(gold), pred))
    return out


class LLMJudge:
    """Binary CORRECT/WRONG judge over any :class:`memgym.llm.base.Backend`, one batched ``generate`` per
    call; unparseable outputs are WRONG with ``parse_ok=False``. ``constrained`` decodes under
    :data:`JUDGE_SCHEMA`.
    """

    def __init__(self, backend: Backend, params: GenerationParams = GenerationParams(max_new_tokens=64, temperature=0),
                 constrained: bool = False):
        if not callable(getattr(backend, "generate", None)):
            raise TypeError(f"backend must implement memgym.llm.base.Backend (a generate method), got {type(backend).__name__}")
        self.backend = backend
        self.params = params
        self.constrained = constrained

    def judge(self, items: list[tuple[str, str, str]]) -> list[JudgeVerdict]:
        """One verdict per (question, gold, prediction), in order. Raises TypeError / ValueError before
        any call, :class:`LLMError` on a count mismatch.
        """
        checked = _check_judge_items(items)
        if not checked:
            return []
        batch = [_judge_messages(q, g, p) for q, g, p in checked]
        if self.constrained:
            completions = self.backend.generate(batch, self.params, schemas=[JUDGE_SCHEMA] * len(batch))
        else:
            completions = self.backend.generate(batch, self.params)
        if len(completions) != len(batch):
            raise LLMError(
                f"judge backend {getattr(self.backend, 'model_id', '?')} returned "
                f"{len(completions)} completions for {len(batch)} prompts"
            )
        verdicts = []
        for c in completions:
            raw = getattr(c, "text", None)
            raw = raw if isinstance(raw, str) else ""
            label = parse_judge_label(raw)
            verdicts.append(JudgeVerdict(correct=label == "CORRECT", raw=raw, parse_ok=label is not None))
        return verdicts


@dataclass(frozen=True)
class ScoreItem:
    """What a scorer may look at for one question: question, gold (int -> str), prediction,
    context, category, qid, rubric, ``evidence`` (gold evidence turn ids) and ``source`` (the
    conversation's :class:`memgym.rewards.scoring.grounded.SourceIndex`, for scorers with
    ``needs_source``). Raises TypeError naming a wrongly typed field.
    """

    question: str
    gold: str
    prediction: str = ""
    context: str = ""
    category: str | int | None = None
    qid: str | None = None
    rubric: tuple[str, ...] = ()
    evidence: tuple[str, ...] = ()
    source: object = None

    def __post_init__(self):
        if isinstance(self.gold, int) and not isinstance(self.gold, bool):
            object.__setattr__(self, "gold", str(self.gold))
        for name in ("question", "gold", "prediction", "context"):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"ScoreItem.{name} must be a str, got {type(value).__name__}: {value!r:.80}")
        for name in ("rubric", "evidence"):
            if not isinstance(getattr(self, name), tuple):
                object.__setattr__(self, name, tuple(getattr(self, name)))
        if self.qid is not None and not isinstance(self.qid, str):
            raise TypeError(f"ScoreItem.qid must be a str or None, got {type(self.qid).__name__}")
        if self.category is not None and (isinstance(self.category, bool) or not isinstance(self.category, (str, int))):
            raise TypeError(f"ScoreItem.category must be a str, int or None, got {type(self.category).__name__}")


@runtime_checkable
class Scorer(Protocol):
    """Scorer interface: ``score(items) -> list[float]`` in [0, 1]; ``name`` is the CLI name,
    ``needs_prediction`` whether items need an answer.
    """

    name: str
    needs_prediction: bool

    def score(self, items: list[ScoreItem]) -> list[float]: ...


def check_score_items(items) -> list[ScoreItem]:
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise TypeError(f"items must be a list of ScoreItem, got {type(items).__name__}")
    for i, it in enumerate(items):
        if not isinstance(it, ScoreItem):
            raise TypeError(f"items[{i}] must be a ScoreItem, got {type(it).__name__}")
    return list(items)


class F1Scorer:
    """LoCoMo token F1 (:func:`memgym.rewards.scoring.metrics.locomo_f1`); non-LoCoMo categories get
    plain F1, or raise ValueError (naming the item) when ``strict``.
    """

    name = "f1"
    needs_prediction = True

    def __init__(self, strict: bool = False):
        self.strict = strict

    def score(self, items: list[ScoreItem]) -> list[float]:
        items = check_score_items(items)
        is_locomo = [it.category is not None and str(it.category).strip() in LOCOMO_CATEGORIES for it in items]
        if self.strict:
            for i, (it, ok) in enumerate(zip(items, is_locomo)):
                if not ok:
                    raise ValueError(f"items[{i}]: category {it.category!r} is not a LoCoMo category (strict F1Scorer)")
        return [
            locomo_f1(it.prediction, it.gold, it.category) if ok else f1_score(it.prediction, it.gold)
            for it, ok in zip(items, is_locomo)
        ]


class RecallScorer:
    """Answer-recall of the gold over the retrieved context (:func:`memgym.rewards.scoring.metrics.answer_recall`).
    Needs no model call and ignores the prediction."""

    name = "answer-recall"
    needs_prediction = False

    def score(self, items: list[ScoreItem]) -> list[float]:
        return [answer_recall(it.gold, it.context) for it in check_score_items(items)]


class LLMJudgeScorer:
    """1.0 for CORRECT, else 0.0, from an :class:`LLMJudge`; keeps ``last_verdicts`` and counts
    ``parse_failures``.
    """

    name = "llm"
    needs_prediction = True

    def __init__(self, judge: LLMJudge | Backend, params: GenerationParams | None = None, constrained: bool = False):
        if isinstance(judge, LLMJudge):
            if params is not None or constrained:
                raise ValueError("pass params/constrained to the LLMJudge, not to LLMJudgeScorer, when giving a judge")
            self.judge = judge
        else:
            self.judge = (LLMJudge(judge, constrained=constrained) if params is None
                          else LLMJudge(judge, params, constrained=constrained))
        self.last_verdicts: list[JudgeVerdict] = []
        self.parse_failures = 0

    def score(self, items: list[ScoreItem]) -> list[float]:
        items = check_score_items(items)
        verdicts = self.judge.judge([(it.question, it.gold, it.prediction) for it in items])
        self.last_verdicts = verdicts
        self.parse_failures += sum(not v.parse_ok for v in verdicts)
        return [1.0 if v.correct else 0.0 for v in verdicts]
