"""Pipeline diagnostics d_ext, d_idx, d_ret (PrisMem cold start), per task and per capability.

Source: PrisMem (arXiv 2610.06361), appendix "diagnostics". With
``m(e, Z) = max_{z ∈ Z} cos(φ(e), φ(z))`` (0.0 for empty Z) and e an evidence turn's text
(its caption when empty): d_ext = m(e, units of e's session), d_idx = m(e, retrieve(e as the
query)), d_ret = m(e, retrieve(the question's query)). Retrieved text is split into non-empty
lines. A task's value is the mean over its evidence; tasks without resolvable evidence are
counted in ``n_no_evidence``. Also ``mean_unit_chars`` and ``mean_retrieved_chars``.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import numpy as np
from tqdm.auto import tqdm

from memgym.memory_bank.contract import unit_text

METRICS = ("d_ext", "d_idx", "d_ret")


@dataclass
class EvidenceTrace:
    """One evidence snippet: ``text`` (e), ``units`` (texts of U_e) and ``probe`` (retrieve's
    output for e as the query, or None when not measured)."""

    text: str
    units: list[str]
    probe: str | None = None


@dataclass
class DiagTask:
    """One task: ``id``, primary ``capability`` letter (None = unlabelled), its evidence, and
    ``retrieved`` (retrieve's output for the real question)."""

    id: str
    capability: str | None
    evidence: list[EvidenceTrace] = field(default_factory=list)
    retrieved: str = ""


def split_segments(text: str) -> list[str]:
    """Retrieved text → its segments: the non-empty lines, stripped, in order."""
    return [s for s in (line.strip() for line in text.splitlines()) if s]


def max_match(e_vec: np.ndarray, z_vecs: np.ndarray) -> float:
    """m(e, Z) = max over rows z of cos(e, z) for L2-normalised ``e_vec`` (dim,) and ``z_vecs``
    (n, dim); 0.0 when n == 0. Result in [-1, 1]."""
    if z_vecs.shape[0] == 0:
        return 0.0
    return float(np.clip(np.max(z_vecs @ e_vec), -1.0, 1.0))


def _mean(xs):
    xs = [x for x in xs if x is not None]
    return sum(xs) / len(xs) if xs else None


class _Vectors:
    """Embeds every distinct text once (batched, with a progress bar)."""

    def __init__(self, embedder, texts: list[str], progress: bool, chunk: int = 512):
        uniq = list(dict.fromkeys(t for t in texts if t))
        self.index = {t: i for i, t in enumerate(uniq)}
        parts = [np.asarray(embedder.encode(uniq[i: i + chunk]), dtype=np.float32)
                 for i in tqdm(range(0, len(uniq), chunk), desc="diagnostics: embed", unit="chunk",
                               disable=not progress or len(uniq) <= chunk, leave=False)]
        dim = parts[0].shape[1] if parts else 1
        mat = np.vstack(parts) if parts else np.zeros((0, dim), dtype=np.float32)
        norms = np.linalg.norm(mat, axis=1, keepdims=True)
        self.mat = mat / np.where(norms > 0, norms, 1.0)
        self.dim = dim

    def rows(self, texts: list[str]) -> np.ndarray:
        ids = [self.index[t] for t in texts if t in self.index]
        return self.mat[ids] if ids else np.zeros((0, self.dim), dtype=np.float32)

    def vec(self, text: str) -> np.ndarray | None:
        i = self.index.get(text)
        return None if i is None else self.mat[i]


def diagnose_tasks(tasks: list[DiagTask], embedder, *, progress: bool = False) -> dict:
    """``{"overall", "by_capability", "n_no_evidence", "tasks"}`` of ``tasks`` under ``embedder``;
    values in [-1, 1], None where nothing was measured.
    """
    texts = []
    for t in tasks:
        texts += split_segments(t.retrieved)
        for ev in t.evidence:
            texts.append(ev.text)
            texts += ev.units
            if ev.probe is not None:
                texts += split_segments(ev.probe)
    vecs = _Vectors(embedder, texts, progress)
    per_task = []
    for t in tasks:
        ret_rows = vecs.rows(split_segments(t.retrieved))
        vals = {m: [] for m in METRICS}
        for ev in t.evidence:
            e = vecs.vec(ev.text)
            if e is None:  # empty evidence text
                continue
            vals["d_ext"].append(max_match(e, vecs.rows(ev.units)))
            if ev.probe is not None:
                vals["d_idx"].append(max_match(e, vecs.rows(split_segments(ev.probe))))
            vals["d_ret"].append(max_match(e, ret_rows))
        if not vals["d_ext"]:
            per_task.append({"id": t.id, "capability": t.capability, **{m: None for m in METRICS}})
            continue
        per_task.append({"id": t.id, "capability": t.capability, **{m: _mean(v) for m, v in vals.items()}})
    measured = [r for r in per_task if r["d_ext"] is not None]
    groups = defaultdict(list)
    for r in measured:
        groups[r["capability"] or "?"].append(r)

    def agg(rows):
        return {**{m: _mean([r[m] for r in rows]) for m in METRICS}, "n": len(rows)}

    return {"overall": agg(measured), "by_capability": {c: agg(v) for c, v in sorted(groups.items())},
            "n_no_evidence": len(per_task) - len(measured), "tasks": per_task}


def tasks_from_run(run) -> list[DiagTask]:
    """Build :class:`DiagTask` s from an :class:`memgym.evolution.execution.runner.ProgramRun`: evidence ids
    resolved through each conversation's ``turn_index``, U_e = the units of the evidence
    turn's session, the probes of the trace as R_e."""
    traces = {tr.conversation.id: tr for tr in run.traces}
    fields = run.info.unit_fields
    out = []
    for task in run.tasks:
        tr = traces[task.conversation]
        index = tr.conversation.turn_index
        units_of = {idx: [unit_text(u, fields) for u in units] for idx, units in zip(tr.session_index, tr.units)}
        evidence = []
        for turn_id in dict.fromkeys(task.qa.evidence):
            if turn_id not in index:
                continue
            session, turn = index[turn_id]
            evidence.append(EvidenceTrace(turn.text or turn.image_caption or "", units_of.get(session, []),
                                          tr.probes.get(turn_id) if tr.probes else None))
        out.append(DiagTask(task.key, task.capability, evidence, task.retrieved))
    return out


def diagnose_run(run, embedder, *, progress: bool = False) -> dict:
    """Diagnostics of a whole :class:`~memgym.evolution.execution.runner.ProgramRun` (see :func:`diagnose_tasks`)
    plus ``mean_unit_chars``, ``mean_retrieved_chars`` (characters; None when there is
    nothing to average) and ``n_units``."""
    rep = diagnose_tasks(tasks_from_run(run), embedder, progress=progress)
    lengths = [len(unit_text(u, run.info.unit_fields)) for tr in run.traces for units in tr.units for u in units]
    rep["n_units"] = len(lengths)
    rep["mean_unit_chars"] = _mean(lengths)
    rep["mean_retrieved_chars"] = _mean([len(t.retrieved) for t in run.tasks])
    return rep
