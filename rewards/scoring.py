"""``memgym score``: score any system's predictions with a benchmark's official judge.

Input: one JSON object per line, ``{"question_id": str, "prediction": str}`` (an optional
``"context"`` string is the text the recall proxies read; without it they read the
prediction). Question ids are those ``memgym data stats --ids`` lists. Output
(:func:`write_scores`): ``scores.json`` with ``overall``, ``by_category`` (native label ->
mean), ``by_capability`` (letter -> mean), ``headline`` (the benchmark's own numbers, see
:func:`rewards.official.headline`), ``missing`` (ids without a prediction: scored 0),
``unknown`` (ids not in the data: ignored), ``judge`` (call accounting) and ``report.md``.
"""
from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from data_synth.capabilities import CAPABILITY_ORDER
from memory_bank.schema import Conversation
from rewards.judge import ScoreItem
from rewards.official import headline, headline_overall, judge_stats

__all__ = ["PredictionsError", "read_predictions", "score_predictions", "render_scores", "write_scores"]

OFFLINE_JUDGES = ("f1", "answer-recall", "rubric-recall")


class PredictionsError(ValueError):
    """A predictions file is broken: names the file, the line (1-based) and the field."""

    def __init__(self, file, line: int | str, field: str, reason: str):
        self.file, self.line, self.field, self.reason = str(file), line, field, reason
        super().__init__(f"file {file}, line {line}, field {field}: {reason}")


def read_predictions(path: Path | str) -> dict[str, dict]:
    """``{question_id: {"prediction": str, "context": str | None}}`` from a JSONL file; blank
    lines are skipped.

    Raises:
        FileNotFoundError: the file is absent.
        PredictionsError: a line that is not a JSON object, a missing or non-string
            ``question_id`` / ``prediction``, a non-string ``context``, or a duplicate id.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"predictions file not found: {p}")
    out: dict[str, dict] = {}
    with open(p, encoding="utf-8") as fh:
        for n, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError as e:
                raise PredictionsError(p, n, "-", f"invalid JSON: {e.msg}") from None
            if not isinstance(rec, dict):
                raise PredictionsError(p, n, "-", f"expected a JSON object, got {type(rec).__name__}")
            for key in ("question_id", "prediction"):
                if not isinstance(rec.get(key), str):
                    why = "missing" if key not in rec else f"expected str, got {type(rec[key]).__name__}"
                    raise PredictionsError(p, n, key, why)
            ctx = rec.get("context")
            if ctx is not None and not isinstance(ctx, str):
                raise PredictionsError(p, n, "context", f"expected str, got {type(ctx).__name__}")
            qid = rec["question_id"]
            if qid in out:
                raise PredictionsError(p, n, "question_id", f"duplicate id {qid!r} (line {out[qid]['line']})")
            out[qid] = {"prediction": rec["prediction"], "context": ctx, "line": n}
    return out


def _mean(xs):
    return sum(xs) / len(xs) if xs else 0.0


def score_predictions(dataset: str, convs: list[Conversation], predictions: dict[str, dict], scorer) -> dict:
    """Score every question of ``convs`` (a missing prediction scores 0 and is listed) with
    ``scorer`` (any :class:`rewards.judge.Scorer`, one ``score`` call for all predicted
    questions). Returns the ``scores.json`` dict (see the module docstring) plus ``rows``
    (one per question: id, conversation, category, capability, score, missing)."""
    rows, items, idx = [], [], []
    known = set()
    for c in convs:
        for q in c.questions:
            known.add(q.id)
            row = {"id": q.id, "conversation": c.id, "category": str(q.category),
                   "capability": q.capability.value if q.capability is not None else None,
                   "score": 0.0, "missing": q.id not in predictions}
            rows.append(row)
            if not row["missing"]:
                pr = predictions[q.id]
                text = pr["context"] if pr["context"] is not None else pr["prediction"]  # what the proxies read
                items.append(ScoreItem(q.question, q.answer, pr["prediction"], text, q.category, q.id, q.rubric))
                idx.append(len(rows) - 1)
    for i, s in zip(idx, scorer.score(items) if items else []):
        rows[i]["score"] = float(s)
    by_cat, by_cap = defaultdict(list), defaultdict(list)
    for r in rows:
        by_cat[r["category"]].append(r["score"])
        if r["capability"]:
            by_cap[r["capability"]].append(r["score"])
    head = headline(dataset, rows)
    return {
        "dataset": dataset,
        "judge": getattr(scorer, "name", "?"),
        "n": len(rows),
        "n_scored": len(items),
        "overall": headline_overall(dataset, head),
        "by_category": {k: _mean(v) for k, v in sorted(by_cat.items())},
        "by_capability": {c.value: _mean(by_cap[c.value]) for c in CAPABILITY_ORDER if c.value in by_cap},
        "headline": head,
        "missing": [r["id"] for r in rows if r["missing"]],
        "unknown": [q for q in predictions if q not in known],
        "judge_calls": judge_stats(scorer),
        "rows": rows,
    }


def render_scores(rep: dict, judge_spec: str) -> str:
    """``report.md`` of a :func:`score_predictions` result."""
    out = [f"# memgym score: {rep['dataset']}", "",
           f"- judge: `{judge_spec}`; questions: {rep['n']}, scored: {rep['n_scored']}, missing (scored 0): "
           f"{len(rep['missing'])}, unknown ids ignored: {len(rep['unknown'])}",
           f"- overall: **{rep['overall']:.4f}**"]
    head = rep["headline"]
    if rep["dataset"] == "beam":
        out.append(f"- {head['note']}")
    if rep["dataset"] == "longmemeval":
        ab = head["abstention_accuracy"]
        out += [f"- task-averaged accuracy: {head['task_averaged_accuracy']:.4f}; overall accuracy: "
                f"{head['overall_accuracy']:.4f}; abstention accuracy: {'-' if ab is None else f'{ab:.4f}'} "
                f"({head['n_abstention']} `_abs` ids)"]
    jc = rep.get("judge_calls")
    if jc:
        out.append(f"- judge calls: {jc['prompts']} prompts, {jc['retried']} retried, {jc['unparsable']} unparsable "
                   f"after the retry (scored 0)")
    label = "ability" if rep["dataset"] == "beam" else "category"
    table = head["by_ability"] if rep["dataset"] == "beam" else rep["by_category"]
    out += ["", f"## By {label}" + (" (mean per chat, then over chats)" if rep["dataset"] == "beam" else ""), "",
            f"| {label} | score |", "|---|---|"]
    out += [f"| {k} | {v:.4f} |" for k, v in table.items()]
    out += ["", "## By capability", "", "| capability | score |", "|---|---|"]
    out += [f"| {k} | {v:.4f} |" for k, v in rep["by_capability"].items()]
    for key, title in (("missing", "Missing predictions (scored 0)"), ("unknown", "Unknown ids (not in the data)")):
        if rep[key]:
            shown = rep[key][:20]
            more = f" ... and {len(rep[key]) - 20} more" if len(rep[key]) > 20 else ""
            out += ["", f"## {title}: {len(rep[key])}", "", ", ".join(f"`{x}`" for x in shown) + more]
    return "\n".join(out) + "\n"


def write_scores(rep: dict, out: Path | str, judge_spec: str) -> None:
    """Write ``scores.json`` (without the per-question rows), ``rows.jsonl`` and ``report.md``."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    slim = {k: v for k, v in rep.items() if k != "rows"}
    slim["judge"] = judge_spec
    (out / "scores.json").write_text(json.dumps(slim, indent=2, ensure_ascii=False), encoding="utf-8")
    with open(out / "rows.jsonl", "w", encoding="utf-8") as fh:
        for r in rep["rows"]:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    (out / "report.md").write_text(render_scores(rep, judge_spec), encoding="utf-8")
