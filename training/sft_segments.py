"""Segmented SFT examples: expert sessions cut into runs of whole turns
(:func:`memgym.memory_bank.construct.split_session`, as inference cuts them), each with its share of
the expert's operations, in the inference prompt layout over the bank before the segment.

Assignment (:func:`assign_texts`): a text (an ADD / UPDATE / MERGE memory, a core APPEND line)
goes to the segment maximising sum over its distinct words w found there of log(S / df(w))
(inverse document frequency, Sparck Jones 1972; words ``[a-z0-9]{3,}``); score 0 everywhere
keeps it at the last segment. REPLACE, REWRITE, NONE and DELETE go to the last segment; an
operation naming ids its segment's prompt does not show moves later, or is dropped and counted
(``SegmentStats.unshown``). Outputs are applied in order core, episodic, semantic, procedural;
one that does not apply raises :class:`SegmentError`.
"""
from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.construct import split_session
from memgym.memory_bank.errors import ManagerOutputError
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.prompts import build_prompt
from memgym.memory_bank.schema import Session
from memgym.training.sft_data import SessionState, check_managers

_WORD = re.compile(r"[a-z0-9]{3,}")


class SegmentError(ValueError):
    """An expert session whose operations do not apply once split into segments (names the
    conversation, session, segment and manager)."""


@dataclass
class SegmentStats:
    """Counts of :func:`segment_rows`: ``sessions``, ``segments`` (over all sessions), ``ops``
    (part operations assigned), ``unshown`` (part operations dropped: ids not shown)."""

    sessions: int = 0
    segments: int = 0
    ops: int = 0
    unshown: int = 0
    per_session: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return {"sessions": self.sessions, "segments": self.segments, "ops": self.ops, "unshown": self.unshown,
                "segments_per_session": {f"{c}/{s}": n for (c, s), n in self.per_session.items()}}


def words(text: str) -> set[str]:
    """The distinct lower-case words (``[a-z0-9]{3,}``) of ``text``."""
    return set(_WORD.findall(text.lower()))


def assign_texts(texts: Sequence[str], segment_texts: Sequence[str]) -> list[int]:
    """For each text, the index of the segment it belongs to (module docstring: the IDF-weighted
    word overlap, ties to the earliest best segment, all-zero scores to the last segment)."""
    n = len(segment_texts)
    if n == 0:
        raise ValueError("no segments")
    seg_words = [words(t) for t in segment_texts]
    df: dict[str, int] = {}
    for ws in seg_words:
        for w in ws:
            df[w] = df.get(w, 0) + 1
    out = []
    for text in texts:
        ws = words(text)
        scores = [sum(math.log(n / df[w]) for w in ws & sw) for sw in seg_words]
        best = max(scores)
        out.append(scores.index(best) if best > 0 else n - 1)
    return out


def _ids(op: dict) -> list[str]:
    if "ids" in op:
        return list(op["ids"])
    return [op["id"]] if "id" in op else []


def _core_outputs(op: dict, segment_texts: Sequence[str]) -> list[dict]:
    n = len(segment_texts)
    out = [{"operation": "NONE"} for _ in range(n)]
    if op.get("operation") == "APPEND":
        lines = [ln for ln in op["content"].splitlines() if ln.strip()]
        where = assign_texts(lines, segment_texts)
        for k in range(n):
            mine = [ln for ln, w in zip(lines, where) if w == k]
            if mine:
                out[k] = {"operation": "APPEND", "content": "\n".join(mine)}
    elif op.get("operation") != "NONE":
        out[-1] = op
    return out


def _part_plan(ops: list[dict], segment_texts: Sequence[str]) -> list[int]:
    texts = [op.get("memory", "") for op in ops]
    where = assign_texts(texts, segment_texts)
    return [len(segment_texts) - 1 if op.get("action") == "DELETE" else w for op, w in zip(ops, where)]


@dataclass
class SegmentStep:
    """One segment of an expert session: ``session`` (the segment's turns), ``segment`` (1-based of
    ``segments``), ``bank_before`` (private copy), ``prompts``, ``outputs`` (the expert's share
    per manager, JSON) and ``state``.
    """

    state: SessionState
    session: Session
    segment: int
    segments: int
    bank_before: MemoryBank
    prompts: dict
    outputs: dict[str, str]


def segment_steps(states: Sequence[SessionState], *, tokenizer, segment_tokens: int, embedder=None,
                  stats: SegmentStats | None = None) -> Iterator[SegmentStep]:
    """Every segment of every session of ``states``, in order (module docstring: the cut, the
    assignment of the expert's operations, the working bank). ``stats`` (optional) is filled in
    as segments are produced. Raises :class:`SegmentError` for operations that do not apply."""
    stats = stats if stats is not None else SegmentStats()
    for st in states:
        tt = [len(tokenizer(t.render(), add_special_tokens=False)["input_ids"]) + 1 for t in st.session.turns]
        segs = split_session(st.session, tt, segment_tokens) if st.session.turns else [st.session]
        seg_texts = [g.transcript() for g in segs]
        n = len(segs)
        stats.sessions += 1
        stats.segments += n
        stats.per_session[(st.conversation_id, st.session.index)] = n
        outputs = [dict() for _ in range(n)]
        for k, o in enumerate(_core_outputs(st.step.outputs["core"], seg_texts)):
            outputs[k]["core"] = o
        pending: dict[str, list[list[dict]]] = {}
        for part in MANAGERS[1:]:
            ops = list(st.step.outputs[part].get("operations", []))
            plan = _part_plan(ops, seg_texts)
            pending[part] = [[op for op, w in zip(ops, plan) if w == k] for k in range(n)]
            stats.ops += len(ops)
        bank = st.bank_before.copy()
        for k, seg in enumerate(segs):
            prompts = {m: build_prompt(m, bank, seg, embedder) for m in MANAGERS}
            for part in MANAGERS[1:]:
                mine, later = [], []
                for op in pending[part][k]:
                    (mine if all(i in prompts[part].shown_ids for i in _ids(op)) else later).append(op)
                if k + 1 < n:
                    pending[part][k + 1][:0] = later  # deferred ops first: the expert's order
                else:
                    stats.unshown += len(later)
                outputs[k][part] = {"operations": mine}
            texts = {m: json.dumps(outputs[k][m], ensure_ascii=False) for m in MANAGERS}
            yield SegmentStep(st, seg, k + 1, n, bank.copy(), prompts, texts)
            for m in MANAGERS:
                try:
                    bank.apply_text(m, texts[m], st.session.index)
                except ManagerOutputError as e:
                    raise SegmentError(f"{st.trajectory_file}: {st.conversation_id} session {st.session.index} "
                                       f"segment {k + 1}/{n}, {m}: the expert's operations do not apply: {e}") from e


def segment_rows(states: Sequence[SessionState], *, tokenizer, segment_tokens: int, embedder=None,
                 managers: Sequence[str] = MANAGERS) -> tuple[list[dict], SegmentStats]:
    """One row per (session, segment, manager) in :func:`memgym.training.sft_data.sft_rows`' columns plus
    ``segment`` and ``segments``. Returns ``(rows, SegmentStats)``. Raises :class:`SegmentError`
    and ValueError for bad managers or ``segment_tokens``.
    """
    ms = check_managers(managers)
    stats = SegmentStats()
    rows: list[dict] = []
    for step in segment_steps(states, tokenizer=tokenizer, segment_tokens=segment_tokens, embedder=embedder,
                              stats=stats):
        for m in MANAGERS:
            if m in ms:
                rows.append({"prompt": step.prompts[m].messages,
                             "completion": [{"role": "assistant", "content": step.outputs[m]}],
                             "conversation_id": step.state.conversation_id, "session": step.session.index,
                             "manager": m, "segment": step.segment, "segments": step.segments})
    return rows, stats


def is_empty_output(manager: str, text: str) -> bool:
    """True for an output that changes nothing: core ``NONE``, a part's empty operation list."""
    obj = json.loads(text)
    return obj.get("operation") == "NONE" if manager == "core" else not obj.get("operations")


def cap_empty(ds, max_per_manager: int | None, seed: int):
    """Keep at most ``max_per_manager`` rows per manager whose completion changes nothing
    (:func:`is_empty_output`), a seeded random choice; every other row is kept, in order.
    Returns ``(dataset, {manager: empty rows dropped})``; None keeps everything."""
    if max_per_manager is None:
        return ds, {}
    if max_per_manager < 0:
        raise ValueError(f"max_per_manager must be >= 0 or None, got {max_per_manager}")
    empty: dict[str, list[int]] = {}
    for i, r in enumerate(ds):
        if is_empty_output(r["manager"], r["completion"][0]["content"]):
            empty.setdefault(r["manager"], []).append(i)
    rng = random.Random(seed)
    drop: set[int] = set()
    dropped = {}
    for m, idx in empty.items():
        if len(idx) > max_per_manager:
            gone = set(idx) - set(rng.sample(idx, max_per_manager))
            drop |= gone
            dropped[m] = len(gone)
    return ds.select([i for i in range(len(ds)) if i not in drop]), dropped
