"""What ``memgym synth qa`` asks the expert and how the reply is checked: the kind quota, the
prompt (current session plus the nearest earlier turns), the reply schema and
:func:`validate_output`. The prompt wording is memgym's own."""
from __future__ import annotations

from collections import Counter
from typing import Literal

import json_repair
import numpy as np
from pydantic import BaseModel, Field

from memgym.data_synth.qa_format import KIND_CAPABILITY, KINDS
from memgym.llm.structured import JsonSchema, closed_schema
from memgym.memory_bank.schema import Conversation, Session, Turn

__all__ = ["kind_quota", "earlier_excerpts", "build_qa_messages", "validate_output", "NEAR_DUPLICATE_COSINE",
           "REJECT_REASONS", "QA_SCHEMA"]


NEAR_DUPLICATE_COSINE = 0.9


class _QAOut(BaseModel):
    question: str = Field(min_length=1)
    answer: str = Field(min_length=1)
    evidence: list[str] = Field(min_length=1)
    kind: Literal["single-session", "multi-session", "temporal"]


class _QAReply(BaseModel):
    qa: list[_QAOut]


#: The expert's reply schema ``{"qa": [{question, answer, evidence, kind}, ...]}`` (from the
#: pydantic model above), used when ``synth_qa(constrained=True)``. Evidence ids stay free
#: strings: validation still checks them against the conversation.
QA_SCHEMA = JsonSchema("session_qa", closed_schema(_QAReply.model_json_schema()))
#: Characters of one turn shown to the expert (LongMemEval assistant turns can be very long).
MAX_TURN_CHARS = 1000
#: What each rejection reason tells the expert on a retry.
REASON_HINTS = {
    "unparsable": 'no JSON object {"qa": [...]} could be read',
    "empty_question": "an empty question",
    "empty_answer": "an empty answer",
    "bad_kind": "a kind that is not single-session, multi-session or temporal",
    "missing_evidence": "no evidence turn ids",
    "unknown_evidence": "evidence ids that are not in the conversation",
    "future_evidence": "evidence from a later session",
    "no_current_evidence": "no evidence from the current session",
    "kind_mismatch": "evidence that does not fit the kind",
    "near_duplicate": "a question that repeats another",
}
REJECT_REASONS = ("unparsable", "empty_question", "empty_answer", "bad_kind", "missing_evidence", "unknown_evidence",
                  "future_evidence", "no_current_evidence", "kind_mismatch", "near_duplicate")

SYSTEM_PROMPT = (
    "You write quiz questions that test whether a long-term memory of a conversation kept what matters. "
    "You read excerpts from earlier sessions and the full current session, and write question-answer "
    "pairs about the current session. Every answer must be stated or directly implied by the turns you "
    "cite. Answers are short (a few words, a name, a date or a short phrase). Reply with one JSON object "
    "and nothing else."
)

KIND_RULES = {
    "single-session": "answerable from the current session alone; cite only current-session turn ids",
    "multi-session": "needs the current session AND an earlier excerpt together; cite ids from both",
    "temporal": ("about when something happened or how long ago; resolve relative dates (\"yesterday\", "
                 "\"last week\") against the session date and give the absolute date in the answer"),
}


def kind_quota(j: int, has_history: bool) -> dict[str, int]:
    """Questions per kind: multi ⌊0.3·j⌋, temporal ⌊0.2·j⌋, the rest single (j = 5 -> 3/1/1);
        session 1's multi share goes to single. ValueError for j < 1."""
    if j < 1:
        raise ValueError(f"questions per session must be >= 1, got {j}")
    multi = int(0.3 * j) if has_history else 0
    temporal = int(0.2 * j)
    return {"single-session": j - multi - temporal, "multi-session": multi, "temporal": temporal}


def _turn_line(turn: Turn, session: Session | None = None) -> str:
    text = turn.text if len(turn.text) <= MAX_TURN_CHARS else turn.text[:MAX_TURN_CHARS] + " …"
    where = f" (session {session.index}, {session.date_text})" if session is not None else ""
    img = f" [shares image: {turn.image_caption}]" if turn.image_caption else ""
    return f"[{turn.id}]{where} {turn.speaker}: {text}{img}"


def earlier_excerpts(conv: Conversation, session: Session, embedder, k: int = 16) -> list[tuple[Session, Turn]]:
    """The ``k`` earlier turns with the highest cosine to any turn of ``session``, in conversation
        order (one ``encode`` call); [] for the first session."""
    earlier = [(s, t) for s in conv.sessions if s.index < session.index for t in s.turns]
    if not earlier or not session.turns:
        return []
    texts = [t.text for _, t in earlier] + [t.text for t in session.turns]
    vecs = embedder.encode(texts)
    sims = (vecs[: len(earlier)] @ vecs[len(earlier):].T).max(axis=1)
    top = sorted(np.argsort(-sims, kind="stable")[:k].tolist())
    return [earlier[i] for i in top]


def build_qa_messages(conv: Conversation, session: Session, quota: dict[str, int],
                      excerpts: list[tuple[Session, Turn]], kept: list[dict], feedback: str = "") -> list[dict]:
    """Chat messages asking for ``quota`` more questions about ``session``, listing ``kept`` and
        the numbered ``feedback`` of rejected attempts (so a retry is a new prompt)."""
    lines = [f"Conversation between {' and '.join(conv.speakers)}.", ""]
    if excerpts:
        lines.append("## Excerpts from earlier sessions")
        lines += [_turn_line(t, s) for s, t in excerpts]
        lines.append("")
    lines.append(f"## Current session {session.index} (date: {session.date_text or 'unknown'})")
    lines += [_turn_line(t) for t in session.turns]
    lines.append("")
    n = sum(quota.values())
    lines.append(f"Write exactly {n} new question-answer pairs about the current session:")
    for kind in KINDS:
        if quota.get(kind):
            lines.append(f"- {quota[kind]} of kind \"{kind}\": {KIND_RULES[kind]}")
    lines.append("Copy turn ids exactly as shown in brackets, e.g. "
                 f"\"{session.turns[0].id if session.turns else 'D1:1'}\".")
    if kept:
        lines.append("Do not repeat or rephrase these questions: " + " | ".join(q["question"] for q in kept))
    if feedback:
        lines.append(f"Your previous answer {feedback}. Fix that.")
    lines.append('Reply with: {"qa": [{"question": "...", "answer": "...", "evidence": ["<turn id>"], '
                 '"kind": "single-session|multi-session|temporal"}]}')
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": "\n".join(lines)}]


def _items(text: str) -> list | None:
    try:
        obj = json_repair.loads(text) if isinstance(text, str) and text.strip() else None
    except Exception:  # json_repair is best-effort on pathological text
        return None
    if isinstance(obj, dict):
        for key in ("qa", "questions", "items"):
            if isinstance(obj.get(key), list):
                return obj[key]
        return [obj] if "question" in obj else None
    if isinstance(obj, list) and obj:
        return obj
    return None


def _kind(raw) -> str | None:
    k = str(raw or "").strip().lower().replace("_", "-").replace(" ", "-")
    if k.startswith("single"):
        return "single-session"
    if k.startswith("multi"):
        return "multi-session"
    return "temporal" if k.startswith("temporal") else None


def _evidence(raw) -> list[str]:
    if isinstance(raw, str):
        raw = raw.replace(";", ",").split(",")
    if not isinstance(raw, list):
        return []
    return list(dict.fromkeys(str(e).strip().strip("[]").strip() for e in raw if str(e).strip().strip("[]").strip()))


def validate_output(text: str, conv: Conversation, session: Session, quota: dict[str, int], kept: list[dict],
                    embedder, turn_index: dict | None = None) -> tuple[list[dict], Counter]:
    """``(new_items, counts)``: the valid items of one expert output within ``quota``, and a
        Counter of rejections: ``unparsable``, ``empty_question``, ``empty_answer``, ``bad_kind``,
        ``missing_evidence``, ``unknown_evidence``, ``future_evidence`` (a later session),
        ``no_current_evidence``, ``kind_mismatch``, ``near_duplicate`` (cosine > 0.9 to ``kept``),
        plus ``surplus`` (valid, beyond quota)."""
    idx = turn_index if turn_index is not None else conv.turn_index
    counts: Counter = Counter()
    items = _items(text)
    if items is None:
        counts["unparsable"] += 1
        return [], counts
    candidates = []
    for it in items:
        if not isinstance(it, dict):
            counts["unparsable"] += 1
            continue
        q = str(it.get("question") or "").strip()
        a = it.get("answer")
        a = str(a).strip() if isinstance(a, (str, int, float)) and not isinstance(a, bool) else ""
        kind = _kind(it.get("kind") or it.get("type"))
        ev = _evidence(it.get("evidence"))
        sessions = {idx[e][0] for e in ev if e in idx}
        reason = (
            "empty_question" if not q else "empty_answer" if not a else "bad_kind" if kind is None
            else "missing_evidence" if not ev else "unknown_evidence" if any(e not in idx for e in ev)
            else "future_evidence" if max(sessions) > session.index
            else "no_current_evidence" if session.index not in sessions
            else "kind_mismatch" if (kind == "single-session" and sessions != {session.index})
            or (kind == "multi-session" and len(sessions) < 2) else None)
        if reason:
            counts[reason] += 1
        else:
            candidates.append({"question": q, "answer": a, "evidence": ev, "kind": kind,
                               "capability": KIND_CAPABILITY[kind].value})
    if not candidates:
        return [], counts
    vecs = embedder.encode([k["question"] for k in kept] + [c["question"] for c in candidates])
    chosen_vecs = list(vecs[: len(kept)])
    left = {k: quota.get(k, 0) for k in KINDS}
    accepted = []
    for c, v in zip(candidates, vecs[len(kept):]):
        if chosen_vecs and max(float(v @ u) for u in chosen_vecs) > NEAR_DUPLICATE_COSINE:
            counts["near_duplicate"] += 1
            continue
        if left[c["kind"]] <= 0:
            counts["surplus"] += 1
            continue
        left[c["kind"]] -= 1
        chosen_vecs.append(v)
        accepted.append(c)
    return accepted, counts
