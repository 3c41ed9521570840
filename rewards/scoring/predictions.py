"""``memgym score``: score any system's predictions with a benchmark's official judge.

Input JSONL: ``{"question_id", "prediction"}`` or LongMemEval's ``{"question_id",
"hypothesis"}``, optional ``"context"``. Output: ``scores.json`` (the summary plus
``judge_protocol``, ``unknown``, ``judge_calls``, ``coverage``), ``rows.jsonl`` and ``report.md``.
A file that covers only some of the questions scores those (the official metrics leave
missing predictions out) but its ``coverage`` says ``partial: k of n questions``; an offline
scorer reads each context cut to the same token budget as an evaluation.
"""
from __future__ import annotations

import json
from pathlib import Path

from memgym.memory_bank.schema import Conversation
from memgym.rewards.scoring.official import judge_stats
from memgym.rewards.scoring.summary import score_questions, summarise

__all__ = ["PredictionsError", "read_predictions", "score_predictions", "render_scores", "write_scores"]

OFFLINE_JUDGES = ("grounded-recall", "f1", "answer-recall", "rubric-recall")
#: Offline scorers that read the context (each cut to the evaluation's token budget).
CONTEXT_JUDGES = ("grounded-recall", "answer-recall", "rubric-recall")
#: The answer field of each accepted format: memgym's, then LongMemEval's.
ANSWER_FIELDS = ("prediction", "hypothesis")


class PredictionsError(ValueError):
    """A predictions file is broken: names the file, the line (1-based) and the field."""

    def __init__(self, file, line: int | str, field: str, reason: str):
        self.file, self.line, self.field, self.reason = str(file), line, field, reason
        super().__init__(f"file {file}, line {line}, field {field}: {reason}")


def read_predictions(path: Path | str) -> dict[str, dict]:
    """``{question_id: {"prediction", "context", "line"}}`` from a predictions JSONL.
    Raises FileNotFoundError, or PredictionsError for a bad line, field or duplicate id.
    """
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"predictions file not found: {p}")
    from memgym.llm.runcard import record_input

    record_input(p, "predictions")
    out: dict[str, dict] = {}
    for n, raw in enumerate(p.read_bytes().split(b"\n"), start=1):
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise PredictionsError(p, n, "-", f"not UTF-8 text (byte 0x{raw[e.start]:02x} at column {e.start + 1})"
                                   ) from None
        if not line.strip():
            continue
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as e:
            raise PredictionsError(p, n, "-", f"invalid JSON: {e.msg}") from None
        if not isinstance(rec, dict):
            raise PredictionsError(p, n, "-", f"expected a JSON object, got {type(rec).__name__}")
        if not isinstance(rec.get("question_id"), str):
            why = "missing" if "question_id" not in rec else f"expected str, got {type(rec['question_id']).__name__}"
            raise PredictionsError(p, n, "question_id", why)
        given = [k for k in ANSWER_FIELDS if k in rec]
        if len(given) != 1:
            raise PredictionsError(p, n, "prediction", "missing (give 'prediction', or LongMemEval's 'hypothesis')"
                                   if not given else "both 'prediction' and 'hypothesis' given; keep one")
        if not isinstance(rec[given[0]], str):
            raise PredictionsError(p, n, given[0], f"expected str, got {type(rec[given[0]]).__name__}")
        ctx = rec.get("context")
        if ctx is not None and not isinstance(ctx, str):
            raise PredictionsError(p, n, "context", f"expected str, got {type(ctx).__name__}")
        qid = rec["question_id"]
        if qid in out:
            raise PredictionsError(p, n, "question_id", f"duplicate id {qid!r} (line {out[qid]['line']})")
        out[qid] = {"prediction": rec[given[0]], "context": ctx, "line": n}
    if not out:
        raise PredictionsError(p, "-", "-", "no predictions (the file holds no JSON line)")
    return out


def coverage(n: int, judged: int) -> str:
    """``complete: n questions`` or ``partial: k of n questions`` (k = questions with a prediction)."""
    return f"complete: {n} questions" if judged == n else f"partial: {judged} of {n} questions"


def score_predictions(dataset: str, convs: list[Conversation], predictions: dict[str, dict], scorer, *,
                      judge_protocol: str = "official", missing_as_wrong: bool = False, budget=None) -> dict:
    """Score every question of ``convs`` with a prediction in one ``score`` call, the rest missing.
    ``budget``: a context budget (``cut(text) -> text``, e.g.
    :class:`memgym.rewards.scoring.context_budget.ContextBudget`) applied to each context before an
    offline scorer reads it. Returns the ``scores.json`` dict plus ``rows``.
    """
    from memgym.rewards.scoring.judge_protocols import protocol_note

    cut = budget.cut if budget is not None else (lambda t: t)
    entries, known = [], set()
    for c in convs:
        for q in c.questions:
            known.add(q.id)
            pr = predictions.get(q.id)
            ctx = cut(pr["context"] if pr["context"] is not None else pr["prediction"]) if pr else None
            entries.append((c.id, q, pr["prediction"] if pr else None, ctx))
    rows = score_questions(scorer, dataset, entries, conversations={c.id: c for c in convs})
    for r in rows:
        if r.id in predictions:
            r.trace = f"predictions line {predictions[r.id]['line']}"
    summary = summarise(dataset, rows, missing_as_wrong=missing_as_wrong)
    name = getattr(scorer, "name", "?")
    return {"dataset": dataset, "scorer": name, "judge_protocol": judge_protocol,
            **({"judge_note": protocol_note(dataset, judge_protocol)} if name == "llm" else {}),
            **summary, "coverage": coverage(summary["n"], summary["judged"]),
            "context_budget": getattr(budget, "identity", None),
            "unknown": [q for q in predictions if q not in known], "judge_calls": judge_stats(scorer),
            "rows": [r.to_dict() for r in rows]}


def render_scores(rep: dict, judge_spec: str) -> str:
    """``report.md`` of a :func:`score_predictions` result (the shared renderer,
    :mod:`memgym.rewards.scoring.report`, with one column: the predictions scored)."""
    from memgym.rewards.scoring.report import headline_table, protocol_lines, side_by_side

    col = [("predictions", rep)]
    partial = rep.get("coverage", "").startswith("partial")
    out = [f"# memgym score: {rep['dataset']}", "",
           *([f"**{rep['coverage']}**: the scores below cover only the questions with a prediction", ""]
             if partial else []),
           f"- judge: `{judge_spec}`; questions: {rep['n']}, judged: {rep['judged']}, missing: {len(rep['missing'])} "
           f"({'counted as wrong' if rep['missing_as_wrong'] else 'not counted, as the official metrics'}), "
           f"unknown ids ignored: {len(rep['unknown'])}",
           *([f"- context budget: every context cut to {rep['context_budget']} before scoring"]
             if rep.get("context_budget") else []),
           *protocol_lines(rep), "", "## Headline", "", *headline_table(rep["dataset"], col, digits=4), "",
           "## By category", "", side_by_side(rep, "by_category", col, digits=4), "",
           "## By capability", "", side_by_side(rep, "by_capability", col, digits=4)]
    if rep["dataset"] == "beam":
        out += ["", f"_{rep['overall_note']}; abilities: mean per chat, then over chats_"]
    for key, title in (("missing", "Missing predictions"), ("unknown", "Unknown ids (not in the data)")):
        if rep[key]:
            shown = rep[key][:20]
            more = f" ... and {len(rep[key]) - 20} more" if len(rep[key]) > 20 else ""
            out += ["", f"## {title}: {len(rep[key])}", "", ", ".join(f"`{x}`" for x in shown) + more]
    return "\n".join(out) + "\n"


def write_scores(rep: dict, out: Path | str, judge_spec: str) -> None:
    """Write ``scores.json`` (without the per-question rows), ``rows.jsonl`` and ``report.md`` (with
    the run card's section when ``rep`` has ``run_card``)."""
    from memgym.llm.runcard import card_markdown

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    slim = {k: v for k, v in rep.items() if k != "rows"}
    slim["judge"] = judge_spec
    (out / "scores.json").write_text(json.dumps(slim, indent=2, ensure_ascii=False), encoding="utf-8")
    with open(out / "rows.jsonl", "w", encoding="utf-8") as fh:
        for r in rep["rows"]:
            fh.write(json.dumps(r, ensure_ascii=False) + "\n")
    card = card_markdown(rep.get("run_card"), str(out / "scores.json"))
    (out / "report.md").write_text(render_scores(rep, judge_spec) + "\n".join(["", *card]), encoding="utf-8")
