"""The one evaluation result: one :class:`QuestionResult` per question (``memgym eval``,
``program eval``, ``score``, evolve) and one summary per dataset (:func:`summarise`), the score
form every report shows.

Means are over judged questions (a missing prediction is listed in ``missing``, or counted 0
with ``missing_as_wrong``); NaN scores are counted in ``undefined``. All datasets: ``n``,
``judged``, ``missing``, ``undefined``, ``overall``, ``by_category``, ``by_capability``.
LongMemEval (``src/evaluation/print_qa_metrics.py``): ``task_averaged``, ``abstention``,
``n_abstention``. BEAM (``src/evaluation/report_results.py``): ``by_ability`` (mean over chats
of chat means), ``by_chat``; ``overall`` = memgym's mean of the abilities (``overall_note``).
"""
from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field

from memgym.data_synth.capabilities import CAPABILITY_ORDER
from memgym.memory_bank.schema import QAItem

__all__ = ["QuestionResult", "ROW_VIEWS", "score_questions", "summarise", "BEAM_OVERALL_NOTE", "SUMMARY_DATASETS"]

SUMMARY_DATASETS = ("locomo", "longmemeval", "beam")
BEAM_OVERALL_NOTE = ("overall = mean of the BEAM abilities present (memgym's summary; the official BEAM report "
                     "gives per-ability scores only)")


#: the fields a report lists per question before its view's own (:meth:`QuestionResult.to_dict`)
_HEAD = ("conversation", "id", "question", "gold", "category", "capability")
#: view -> the keys of one question's JSON row: ``score`` (``memgym score``'s rows.jsonl, ``memgym
#: eval``'s predictions.jsonl), ``task`` (``memgym program eval``'s tasks.jsonl, evolve's task rows)
ROW_VIEWS = {"score": (*_HEAD, "prediction", "score", "missing", "recall", "judge", "detail", "trace"),
             "task": (*_HEAD, "query", "plan_ok", "prediction", "score", "retrieved_chars", "error", "judge", "detail",
                      "trace")}


@dataclass
class QuestionResult:
    """One question of an evaluation, whichever command made it: ``qa`` the question (``id``,
    ``question``, ``gold``, ``category`` read from it), ``capability`` its label (None: none),
    ``score`` in [0, 1] (NaN: undefined tau; None when ``missing``: no prediction to judge),
    ``recall`` the gold answer's word recall in the context, ``judge`` (requests and replies),
    ``detail`` (a scorer's parts), ``trace`` (where its full trace lies). A program run also
    fills ``query`` (the planned Query), ``plan_ok``, ``retrieved`` (<= 16,000 characters, ""
    on a retrieve error), ``error`` and, with diagnostics, ``metrics`` (d_ext, d_idx, d_ret).
    """

    conversation: str
    qa: QAItem
    capability: str | None
    prediction: str | None
    score: float | None
    missing: bool = False
    recall: float | None = None
    judge: list = field(default_factory=list)
    detail: dict | None = None
    trace: str | None = None
    query: dict | None = None
    plan_ok: bool = False
    retrieved: str = ""
    error: str | None = None
    metrics: dict = field(default_factory=dict)

    id = property(lambda self: self.qa.id)
    question = property(lambda self: self.qa.question)
    gold = property(lambda self: str(self.qa.answer))
    category = property(lambda self: str(self.qa.category))
    retrieved_chars = property(lambda self: len(self.retrieved))
    key = property(lambda self: f"{self.conversation}/{self.qa.id}", doc="``<conversation>/<question id>``")

    def to_dict(self, view: str = "score") -> dict:
        """The JSON row of one question: the keys of ``ROW_VIEWS[view]``, then (``task``) the metrics."""
        row = {k: getattr(self, k) for k in ROW_VIEWS[view]}
        return {**row, **self.metrics} if view == "task" else row


def score_questions(scorer, dataset: str | None, entries: Sequence[tuple],
                    conversations: dict | None = None) -> list[QuestionResult]:
    """One :class:`QuestionResult` per ``(conversation_id, qa, prediction, context)`` entry; an entry
    without a prediction is ``missing`` and not judged, the others are scored in one
    :func:`memgym.rewards.scoring.measure.score_items` call. ``conversations``: id -> Conversation,
    the source text a scorer with ``needs_source`` reads.
    """
    from memgym.data_synth.capabilities import capability_for
    from memgym.rewards.scoring.measure import score_items
    from memgym.rewards.scoring.metrics import answer_recall

    rows = []
    for conv_id, q, pred, ctx in entries:
        cap = q.capability or (capability_for(dataset, q.category, q.id) if dataset else None)
        rows.append(QuestionResult(conv_id, q, cap.value if cap is not None else None, pred, None, pred is None,
                                   answer_recall(q.answer, ctx) if ctx is not None else None))
    todo = [(r, e[3]) for r, e in zip(rows, entries) if not r.missing]
    convs = conversations or {}
    scores, last = score_items(scorer, [r.qa for r, _ in todo], [c or "" for _, c in todo],
                               [r.prediction for r, _ in todo], [convs.get(r.conversation) for r, _ in todo])
    for k, ((r, _), score) in enumerate(zip(todo, scores)):
        r.score = score
        if last:
            r.judge, r.detail = last[k].calls, last[k].detail
    return rows


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _undefined(r: QuestionResult) -> bool:
    return not r.missing and isinstance(r.score, float) and math.isnan(r.score)


def _value(r: QuestionResult, missing_as_wrong: bool) -> float | None:
    """The score counted for a row: None = left out of every mean."""
    if r.missing:
        return 0.0 if missing_as_wrong else None
    return None if r.score is None or _undefined(r) else float(r.score)


def _groups(rows: Sequence[QuestionResult], key: str, missing_as_wrong: bool) -> dict:
    g: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        v = _value(r, missing_as_wrong)
        k = getattr(r, key)
        if v is not None and k is not None:
            g[str(k)].append(v)
    return g


def summarise(dataset: str | None, rows: Sequence[QuestionResult], *, missing_as_wrong: bool = False) -> dict:
    """The summary of ``rows`` for ``dataset`` (None: common fields only): the one score form of every
    evaluation report. Raises ValueError for an unknown dataset.
    """
    if dataset is not None and dataset not in SUMMARY_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(SUMMARY_DATASETS)}")
    vals = [_value(r, missing_as_wrong) for r in rows]
    counted = [v for v in vals if v is not None]
    by_cat = _groups(rows, "category", missing_as_wrong)
    by_cap = _groups(rows, "capability", missing_as_wrong)
    cap_order = [c.value for c in CAPABILITY_ORDER]
    out = {
        "n": len(rows),
        "judged": sum(1 for r in rows if not r.missing),
        "missing": [str(r.id) for r in rows if r.missing],
        "missing_as_wrong": missing_as_wrong,
        "undefined": sum(1 for r in rows if _undefined(r)),
        "overall": _mean(counted),
        "by_category": {k: {"score": _mean(v), "n": len(v)} for k, v in sorted(by_cat.items())},
        "by_capability": {k: {"score": _mean(by_cap[k]), "n": len(by_cap[k])}
                          for k in [*cap_order, *sorted(set(by_cap) - set(cap_order))] if k in by_cap},
    }
    if dataset == "longmemeval":
        types = {k: _mean(v) for k, v in sorted(by_cat.items())}
        abst = [v for r, v in zip(rows, vals) if v is not None and "_abs" in str(r.id)]
        out.update(task_averaged=_mean(list(types.values())), abstention=_mean(abst) if abst else None,
                   n_abstention=len(abst), by_type=types)
    elif dataset == "beam":
        from memgym.rewards.scoring.beam_judge import BEAM_ABILITY_ORDER

        per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r, v in zip(rows, vals):
            if v is not None:
                per[str(r.conversation)][str(r.category)].append(v)
        by_chat = {c: {a: _mean(v) for a, v in ab.items()} for c, ab in sorted(per.items())}
        over: dict[str, list[float]] = defaultdict(list)
        for ab in by_chat.values():
            for a, v in ab.items():
                over[a].append(v)
        order = [a for a in BEAM_ABILITY_ORDER if a in over] + sorted(a for a in over if a not in BEAM_ABILITY_ORDER)
        by_ability = {a: _mean(over[a]) for a in order}
        out.update(by_ability=by_ability, by_chat=by_chat, overall=_mean(list(by_ability.values())),
                   overall_note=BEAM_OVERALL_NOTE)
    return out
