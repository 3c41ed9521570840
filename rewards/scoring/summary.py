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
from dataclasses import asdict, dataclass, field

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

    @property
    def id(self) -> str:
        return self.qa.id

    @property
    def question(self) -> str:
        return self.qa.question

    @property
    def gold(self) -> str:
        return str(self.qa.answer)

    @property
    def category(self) -> str:
        return str(self.qa.category)

    @property
    def retrieved_chars(self) -> int:
        return len(self.retrieved)

    @property
    def key(self) -> str:
        """``<conversation>/<question id>``, the task id of evolve's per-task scores."""
        return f"{self.conversation}/{self.qa.id}"

    def to_dict(self, view: str = "score") -> dict:
        """The JSON row of one question: the keys of ``ROW_VIEWS[view]``, then (``task``) the metrics."""
        row = {k: getattr(self, k) for k in ROW_VIEWS[view]}
        return {**row, **self.metrics} if view == "task" else row


def score_questions(scorer, dataset: str | None, entries: Sequence[tuple], trace: str | None = None,
                    missing: set | None = None, conversations: dict | None = None) -> list[QuestionResult]:
    """One :class:`QuestionResult` per ``(conversation_id, qa, prediction, context)`` entry, from
    one ``scorer.score`` call; ``missing`` ids are not judged. ``trace``: a format with ``{i}``.
    ``conversations``: id -> Conversation, the source text a scorer with ``needs_source`` reads.
    """
    from memgym.data_synth.capabilities import capability_for
    from memgym.rewards.scoring.judge import ScoreItem
    from memgym.rewards.scoring.metrics import answer_recall

    need = getattr(scorer, "needs_prediction", True)
    rows, todo = [], []
    for i, (conv_id, q, pred, ctx) in enumerate(entries):
        cap = q.capability or (capability_for(dataset, q.category, q.id) if dataset else None)
        miss = (q.id in missing) if missing is not None else (need and pred is None)
        rows.append(QuestionResult(conv_id, q, cap.value if cap is not None else None, pred, None, miss,
                                   answer_recall(q.answer, ctx) if ctx is not None else None,
                                   trace=trace.format(i=i) if trace else None))
        if not miss:
            source = None
            if getattr(scorer, "needs_source", False) and conversations and conv_id in conversations:
                from memgym.rewards.scoring.grounded import source_index
                source = source_index(conversations[conv_id])
            todo.append((i, ScoreItem(q.question, q.answer, pred or "", ctx or "", q.category, q.id, q.rubric,
                                      q.evidence, source)))
    scores = scorer.score([it for _, it in todo]) if todo else []
    last = getattr(scorer, "last", None) or []
    for k, ((i, _), s) in enumerate(zip(todo, scores)):
        rows[i].score = float(s)
        if k < len(last) and len(last) == len(todo):
            rows[i].judge, rows[i].detail = last[k].calls, last[k].detail
    return rows


def _get(r, k):
    return r.get(k) if isinstance(r, dict) else getattr(r, k)


def _mean(xs: Sequence[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _value(r, missing_as_wrong: bool) -> float | None:
    """The score counted for a row: None = left out of every mean."""
    if _get(r, "missing"):
        return 0.0 if missing_as_wrong else None
    s = _get(r, "score")
    if s is None or (isinstance(s, float) and math.isnan(s)):
        return None
    return float(s)


def _groups(rows, key: str, missing_as_wrong: bool) -> dict:
    g: dict[str, list[float]] = defaultdict(list)
    for r in rows:
        v = _value(r, missing_as_wrong)
        k = _get(r, key)
        if v is not None and k is not None:
            g[str(k)].append(v)
    return g


def summarise(dataset: str | None, rows: Sequence, *, missing_as_wrong: bool = False) -> dict:
    """The summary of ``rows`` for ``dataset`` (None: common fields only). Raises ValueError for an
    unknown dataset.
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
        "judged": sum(1 for r in rows if not _get(r, "missing")),
        "missing": [str(_get(r, "id")) for r in rows if _get(r, "missing")],
        "missing_as_wrong": missing_as_wrong,
        "undefined": sum(1 for r in rows if not _get(r, "missing") and _get(r, "score") is not None
                         and isinstance(_get(r, "score"), float) and math.isnan(_get(r, "score"))),
        "overall": _mean(counted),
        "by_category": {k: {"score": _mean(v), "n": len(v)} for k, v in sorted(by_cat.items())},
        "by_capability": {k: {"score": _mean(by_cap[k]), "n": len(by_cap[k])}
                          for k in [*cap_order, *sorted(set(by_cap) - set(cap_order))] if k in by_cap},
    }
    if dataset == "longmemeval":
        types = {k: _mean(v) for k, v in sorted(by_cat.items())}
        abst = [v for r, v in zip(rows, vals) if v is not None and "_abs" in str(_get(r, "id"))]
        out.update(task_averaged=_mean(list(types.values())), abstention=_mean(abst) if abst else None,
                   n_abstention=len(abst), by_type=types)
    elif dataset == "beam":
        from memgym.rewards.scoring.beam_judge import BEAM_ABILITY_ORDER

        per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
        for r, v in zip(rows, vals):
            if v is not None:
                per[str(_get(r, "conversation"))][str(_get(r, "category"))].append(v)
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
