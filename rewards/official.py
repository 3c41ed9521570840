"""Each benchmark's official judge behind the common :class:`rewards.judge.Scorer` interface,
the offline rubric-recall proxy, and each benchmark's headline numbers.

Source: DESIGN.md § "Judges and scoring". ``scorer: llm`` picks the dataset's official judge:
LoCoMo -> the CORRECT/WRONG judge (:class:`rewards.judge.LLMJudgeScorer`), LongMemEval ->
:class:`LongMemEvalScorer`, BEAM -> :class:`BeamScorer`. Headlines: LoCoMo the mean score and
the per-category means; LongMemEval task-averaged / overall / abstention accuracy
(:func:`rewards.longmemeval_judge.longmemeval_headline`); BEAM per ability per chat, then
over chats, overall = the mean of the 10 abilities, labelled as memgym's
(:func:`rewards.beam_judge.beam_headline`).
"""
from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence

from llm.base import Backend, GenerationParams
from rewards.beam_judge import BeamItem, BeamJudge, beam_headline, rubric_recall
from rewards.judge import ScoreItem, _check_score_items
from rewards.judge_calls import JudgeStats
from rewards.longmemeval_judge import LongMemEvalJudge, longmemeval_headline

__all__ = ["LongMemEvalScorer", "BeamScorer", "RubricRecallScorer", "headline", "judge_stats"]


class LongMemEvalScorer:
    """``llm`` scorer for LongMemEval: the per-type yes/no judge; items need ``category``
    (the question type) and ``qid`` (``_abs`` ids get the abstention prompt)."""

    name = "llm"
    needs_prediction = True

    def __init__(self, backend: Backend, params: GenerationParams | None = None):
        self.judge = LongMemEvalJudge(backend, params)

    @property
    def stats(self) -> JudgeStats:
        return self.judge.stats

    @property
    def parse_failures(self) -> int:
        """Replies still unparsable after the retry (scored 0), over the scorer's life."""
        return self.stats.unparsable

    def score(self, items: list[ScoreItem]) -> list[float]:
        items = _check_score_items(items)
        return self.judge.judge([(str(it.category), it.question, it.gold, it.prediction, it.qid) for it in items])


class BeamScorer:
    """``llm`` scorer for BEAM: rubric items scored 1/0.5/0, event ordering by normalised
    Kendall tau-b; items need ``category`` (the ability) and ``rubric``."""

    name = "llm"
    needs_prediction = True

    def __init__(self, backend: Backend, params: GenerationParams | None = None):
        self.judge = BeamJudge(backend, params)

    @property
    def stats(self) -> JudgeStats:
        total = JudgeStats()
        total.add(self.judge.stats)
        total.add(self.judge.match_stats)
        return total

    @property
    def parse_failures(self) -> int:
        """Replies still unparsable after the retry (scored 0), over the scorer's life."""
        return self.stats.unparsable

    def score(self, items: list[ScoreItem]) -> list[float]:
        items = _check_score_items(items)
        return self.judge.score([BeamItem(str(it.category), it.question, tuple(it.rubric), it.prediction)
                                 for it in items])


class RubricRecallScorer:
    """Offline BEAM proxy (:func:`rewards.beam_judge.rubric_recall`) over the text scored:
    the retrieved context when there is one, else the prediction. No model call."""

    name = "rubric-recall"
    needs_prediction = False

    def score(self, items: list[ScoreItem]) -> list[float]:
        items = _check_score_items(items)
        for i, it in enumerate(items):
            if not it.rubric:
                raise ValueError(f"items[{i}] ({it.qid or it.question[:40]!r}) has no rubric: rubric-recall "
                                 f"scores BEAM questions only")
        return [rubric_recall(it.rubric, it.context or it.prediction) for it in items]


def judge_stats(scorer) -> dict | None:
    """The judge's call accounting (``prompts``, ``retried``, ``unparsable``, ``examples``)
    of an LLM scorer, or None for a scorer that makes no judge call."""
    st = getattr(scorer, "stats", None)
    if isinstance(st, JudgeStats):
        return st.to_dict()
    if hasattr(scorer, "parse_failures"):  # LoCoMo's CORRECT/WRONG judge: no retry, failures counted (WRONG)
        return {"prompts": None, "retried": 0, "unparsable": scorer.parse_failures, "examples": []}
    return None


def headline(dataset: str, rows: Sequence[dict]) -> dict:
    """The benchmark's own numbers from ``rows`` of ``{"id", "conversation", "category",
    "score"}``. LoCoMo: ``{"overall", "by_category"}`` (means over questions); LongMemEval:
    see :func:`longmemeval_headline`; BEAM: see :func:`beam_headline`. Raises ValueError for an
    unknown dataset."""
    if dataset == "longmemeval":
        return longmemeval_headline(rows)
    if dataset == "beam":
        return beam_headline(rows)
    if dataset == "locomo":
        by = defaultdict(list)
        for r in rows:
            by[str(r["category"])].append(float(r["score"]))
        n = sum(len(v) for v in by.values())
        return {"overall": sum(sum(v) for v in by.values()) / n if n else 0.0,
                "by_category": {k: sum(v) / len(v) for k, v in sorted(by.items())}}
    raise ValueError(f"unknown dataset {dataset!r}; expected locomo, longmemeval or beam")


def headline_overall(dataset: str, head: dict) -> float:
    """The single overall number of a headline: LoCoMo mean, LongMemEval overall accuracy,
    BEAM mean of the abilities (memgym's)."""
    return float(head["overall_accuracy"] if dataset == "longmemeval" else head["overall"])
