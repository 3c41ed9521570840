"""Synthetic session QA (``memgym synth qa``): J questions per session written by an expert
model, validated, and appended to a resumable JSONL file; or the benchmark's own QA bucketed
by the session of its evidence.

Source: ``DESIGN.md`` § "Dense session reward and ADRPO" (J = 5, about 50% single-session,
30% multi-session, 20% temporal, with evidence turn ids; for training splits the benchmark's
own QA bucketed by session) and MemBuilder (arXiv 2601.05488, §3.4.1 and Fig. 14: the expert
writes questions about the current session and its links to retrieved history). The prompt
wording is memgym's own.

Validation rejects, and counts by reason, per generated item:
``unparsable`` (no JSON object/list could be recovered, or an item is not an object),
``empty_question``, ``empty_answer``, ``bad_kind`` (not one of :data:`KINDS`),
``missing_evidence`` (no turn id), ``unknown_evidence`` (an id not in the conversation),
``future_evidence`` (an id from a later session: not known at session t),
``no_current_evidence`` (nothing from session t: it would not score session t's memory),
``kind_mismatch`` (a single-session item citing other sessions, or a multi-session item
citing only one), ``near_duplicate`` (cosine > 0.9 to a question already kept for the
session, by the embedder). Items beyond a kind's quota are counted as ``surplus`` (valid, not
rejected). A session short of J is asked again, with the reasons, up to ``max_tries`` times;
whatever it holds then is written (``missing`` says how many are short).
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Literal

import json_repair
import numpy as np
from pydantic import BaseModel, Field
from tqdm.auto import tqdm

from data_synth.jsonl import ResumableJsonl
from data_synth.qa_format import KIND_CAPABILITY, KINDS
from llm.base import CallTally, GenerationParams
from llm.structured import JsonSchema, closed_schema
from memory_bank.schema import Conversation, Session, Turn

__all__ = ["kind_quota", "earlier_excerpts", "build_qa_messages", "validate_output", "bucket_benchmark_qa",
           "SynthQAStats", "synth_qa", "NEAR_DUPLICATE_COSINE", "REJECT_REASONS"]

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
    """Questions per kind for one session: multi = ⌊0.3·j⌋, temporal = ⌊0.2·j⌋, the rest
    single-session (j = 5 → 3/1/1, j = 10 → 5/3/2). Without earlier sessions (session 1) the
    multi-session share goes to single-session. Raises ValueError for j < 1."""
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
    """The ``k`` earlier turns most similar to the current session, in conversation order.

    A turn's score is its highest cosine to any turn of ``session`` (``embedder`` vectors are
    L2-normalised; one ``encode`` call). Returns [] for the first session."""
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
    """Chat messages asking for ``quota`` more questions about ``session``.

    ``kept``: questions already accepted (not to be repeated); ``feedback``: which attempt
    was rejected and why (numbered, so every retry is a different prompt and a cached
    greedy answer is not simply replayed)."""
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
    """Validate one expert output against the rules in the module docstring.

    Returns ``(new_items, counts)``: the accepted items ``{question, answer, evidence, kind,
    capability}`` within ``quota`` (which is not modified), and a Counter of rejection
    reasons plus ``surplus``. ``kept`` (already accepted questions of this session) is used
    for the near-duplicate test; one ``embedder.encode`` call per output."""
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


def bucket_benchmark_qa(conv: Conversation, n_sessions: int | None = None) -> tuple[dict[int, list[dict]], int]:
    """The benchmark's own QA bucketed by the session of its latest evidence turn.

    Returns ``({session index: [item, ...]}, dropped)`` over the first ``n_sessions``
    sessions; an item with no valid evidence, or with evidence beyond ``n_sessions``, is
    dropped and counted. Items keep their benchmark id, category (as ``kind``) and
    capability."""
    limit = n_sessions or len(conv.sessions)
    kept_sessions = {s.index for s in conv.sessions[:limit]}
    out: dict[int, list[dict]] = {s: [] for s in sorted(kept_sessions)}
    dropped = 0
    for q in conv.questions:
        sessions = conv.evidence_sessions(q)
        if not sessions or max(sessions) not in kept_sessions:
            dropped += 1
            continue
        item = {"id": q.id, "question": q.question, "answer": q.answer, "evidence": list(q.evidence),
                "kind": q.category}
        if q.capability is not None:
            item["capability"] = q.capability.value
        out[max(sessions)].append(item)
    return out, dropped


@dataclass
class SynthQAStats(CallTally):
    """Accounting of one ``synth qa`` run. Tokens are the expert's, for calls that reached
    the model (cache hits are counted in ``cached_completions`` and cost nothing)."""

    sessions_written: int = 0
    sessions_resumed: int = 0
    sessions_retried_empty: int = 0
    sessions_empty: int = 0
    sessions_short: int = 0
    attempts: int = 0
    accepted: int = 0
    generated_items: int = 0
    rejected: Counter = field(default_factory=Counter)
    surplus: int = 0
    benchmark_dropped: int = 0
    repaired_bytes: int = 0

    def to_json(self) -> dict:
        """Plain dict; ``rejected_share`` = rejected / (rejected + accepted + surplus) items,
        with ``unparsable`` outputs counted as one item each."""
        total = sum(self.rejected.values()) + self.accepted + self.surplus
        d = {k: v for k, v in self.__dict__.items() if k != "rejected"}
        d["rejected"] = {r: self.rejected.get(r, 0) for r in REJECT_REASONS}
        d["rejected_total"] = sum(self.rejected.values())
        d["rejected_share"] = round(sum(self.rejected.values()) / total, 4) if total else 0.0
        d["rejected_share_by_reason"] = {r: round(self.rejected.get(r, 0) / total, 4) if total else 0.0
                                         for r in REJECT_REASONS}
        return d


def _session_key(rec: dict):
    return (rec.get("conversation_id"), rec.get("session"))


def run_settings(source: str, backend, j: int) -> dict:
    """The settings a ``synth qa`` line records and a resume must match: ``source``, the
    ``expert`` model id (expert source) and ``j`` (expert source; benchmark lines hold the
    benchmark's own QA, whatever j is)."""
    if source == "benchmark":
        return {"source": "benchmark", "expert": None, "j": None}
    return {"source": "expert", "expert": getattr(backend, "model_id", "?"), "j": j}


def _line_settings(rec: dict) -> dict:
    if rec.get("source") == "benchmark":
        return {"source": "benchmark", "expert": None, "j": None}
    j = rec.get("j")
    if j is None and isinstance(rec.get("qa"), list) and isinstance(rec.get("missing"), int):
        j = len(rec["qa"]) + rec["missing"]  # lines written before j was recorded
    return {"source": rec.get("source"), "expert": rec.get("expert"), "j": j}


def check_resume_settings(records: list[dict], want: dict, out_path) -> None:
    """Refuse to resume a file written with other settings (its old lines would be mixed with
    new ones while the summary reports only the new settings). Raises ValueError naming the
    file, the first differing line's settings and the requested ones."""
    for no, rec in enumerate(records, 1):
        have = _line_settings(rec)
        if have != want:
            diff = ", ".join(f"{k} {have[k]!r} (now {want[k]!r})" for k in want if have[k] != want[k])
            raise ValueError(f"{out_path}: line {no} was written with other settings: {diff}; resume with the same "
                             "--source/--expert/--j, or write to another --out")


def synth_qa(convs: list[Conversation], out_path, *, source: str = "expert", backend=None, embedder=None,
             j: int = 5, max_tries: int = 3, concurrency: int = 8, n_sessions: int | None = None,
             params: GenerationParams | None = None, progress: bool = True, constrained: bool = False) -> SynthQAStats:
    """Write one line per session of ``convs`` to ``out_path`` (resumable; see
    :mod:`data_synth.jsonl`), skipping sessions already there.

    source "expert": ``backend`` writes ``j`` questions per session; the sessions of a
    conversation go to the backend ``concurrency`` at a time in one ``generate`` call per
    attempt (the backend runs them concurrently); ``embedder`` retrieves earlier excerpts and
    finds near-duplicates. source "benchmark": :func:`bucket_benchmark_qa` (no model; the
    caller must refuse test splits). ``params`` default: greedy, 1024 new tokens.
    ``constrained``: decode the expert's replies under :data:`QA_SCHEMA` (structured outputs).
    Resume: every line records its settings (:func:`run_settings`); a file written with other
    settings is refused, and expert sessions that came back with no question are redone.
    Raises ValueError for a bad source / j / max_tries / concurrency, a missing backend, or
    a resume with other settings.
    """
    if source not in ("expert", "benchmark"):
        raise ValueError(f"source must be expert or benchmark, got {source!r}")
    if max_tries < 1 or concurrency < 1:
        raise ValueError(f"max_tries and concurrency must be >= 1, got {max_tries}, {concurrency}")
    if source == "expert" and (backend is None or embedder is None):
        raise ValueError("source 'expert' needs an expert backend and an embedder")
    kind_quota(j, False)  # validates j
    params = params or GenerationParams(max_new_tokens=1024, temperature=0.0)
    stats = SynthQAStats()
    want = run_settings(source, backend, j)
    with ResumableJsonl(out_path, _session_key) as log:
        stats.repaired_bytes = log.repaired_bytes
        check_resume_settings(log.records, want, out_path)
        # a session that came back with no question is redone (e.g. with a higher max_tries)
        stats.sessions_retried_empty = log.drop([_session_key(r) for r in log.records
                                                 if r.get("source") == "expert" and not r.get("qa")])
        for conv in tqdm(convs, desc="synth qa", unit="conv", disable=not progress):
            sessions = conv.sessions[:n_sessions] if n_sessions else conv.sessions
            todo = [s for s in sessions if (conv.id, s.index) not in log.done]
            stats.sessions_resumed += len(sessions) - len(todo)
            if source == "benchmark":
                buckets, dropped = bucket_benchmark_qa(conv, n_sessions)
                stats.benchmark_dropped += dropped
                for s in todo:
                    log.append({"conversation_id": conv.id, "session": s.index, "date": s.date_text,
                                "qa": buckets.get(s.index, []), "source": "benchmark"})
                    stats.sessions_written += 1
                    stats.sessions_empty += not buckets.get(s.index)
                continue
            for i in range(0, len(todo), concurrency):
                for line in _generate_chunk(conv, todo[i: i + concurrency], backend, embedder, j, max_tries,
                                            params, stats, constrained):
                    log.append(line)
                    stats.sessions_written += 1
                    stats.sessions_empty += not line["qa"]
    return stats


def _generate_chunk(conv, chunk, backend, embedder, j, max_tries, params, stats, constrained=False) -> list[dict]:
    idx = conv.turn_index
    state = {s.index: {"kept": [], "feedback": "", "tries": 0, "rejected": Counter(),
                       "quota": kind_quota(j, s.index > conv.sessions[0].index),
                       "excerpts": earlier_excerpts(conv, s, embedder)} for s in chunk}
    for _ in range(max_tries):
        pending = []
        for s in chunk:
            st = state[s.index]
            left = {k: st["quota"][k] - sum(q["kind"] == k for q in st["kept"]) for k in KINDS}
            if sum(left.values()) > 0:
                pending.append((s, left))
        if not pending:
            break
        batch = [build_qa_messages(conv, s, left, state[s.index]["excerpts"], state[s.index]["kept"],
                                   state[s.index]["feedback"]) for s, left in pending]
        completions = (backend.generate(batch, params, schemas=[QA_SCHEMA] * len(batch)) if constrained
                       else backend.generate(batch, params))
        stats.attempts += len(batch)
        for (s, left), comp in zip(pending, completions):
            st = state[s.index]
            st["tries"] += 1
            stats.book(comp)
            new, counts = validate_output(comp.text, conv, s, left, st["kept"], embedder, idx)
            st["kept"] += new
            stats.accepted += len(new)
            stats.surplus += counts.pop("surplus", 0)
            stats.generated_items += len(new) + sum(counts.values())
            stats.rejected.update(counts)
            st["rejected"].update(counts)
            # the attempt number keeps every retry a new prompt (a cached greedy answer would repeat itself)
            st["feedback"] = (f"(attempt {st['tries']}) was rejected: " + "; ".join(
                f"{n} item(s) with {REASON_HINTS[r]}" for r, n in counts.items())) if counts else ""
    lines = []
    for s in chunk:
        st = state[s.index]
        order = {k: i for i, k in enumerate(KINDS)}
        qa = sorted(st["kept"], key=lambda q: order[q["kind"]])
        missing = j - len(qa)
        stats.sessions_short += missing > 0
        lines.append({"conversation_id": conv.id, "session": s.index, "date": s.date_text, "qa": qa,
                      "source": "expert", "expert": getattr(backend, "model_id", "?"), "j": j, "tries": st["tries"],
                      "missing": missing, "rejected": dict(st["rejected"])})
    return lines

