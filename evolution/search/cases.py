"""Compact diagnostic cases (PrisMem appendix "diagnostic cases"; docs/design.md § "Compact
diagnostic cases").

A case shows the capability labels (primary, secondary), question, reference answer,
prediction, score, query plan, retrieved text and the evidence view: each reference evidence
snippet, its source text (the session transcript) and the memory units of that session.
:func:`render_full` prints all of it; :func:`render_compact` applies the budget rules:

- every displayed excerpt is at most ``budget`` = 2,400 characters; shorter texts stay whole;
- longer texts are split into records (lines: retrieved lines, transcript turns), and records
  longer than a quarter of the budget into sentences; header lines (``Session ...``, dates,
  ``[id] role:`` prefixes stay with their record) and fenced code blocks are never split;
- spans are chosen greedily; a span's similarity to a cue is 0.75 × cosine (the run's
  embedder) + 0.25 × Dice of stemmed non-stopword tokens; cues: question + answer (weight 1),
  the evidence snippets (weight 1 in total, split evenly), the prediction (weight 0.5). The
  greedy gain of a span is Σ_cues w · max(0, sim − covered) + 0.1 · Σ_cues w · sim
  (covered = the best similarity a chosen span already reaches for that cue);
- chosen spans go back in source order, with ``...`` lines marking omissions;
- for extracted memory the best-matching unit of every evidence snippet is always kept
  (then other units as space permits), and a unit already displayed is not repeated.

All sizes are characters; :func:`render_compact` counts the "best unit kept" rule in its stats.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np

BUDGET = 2400
COS_W, DICE_W = 0.75, 0.25
QA_W, EVIDENCE_W, PRED_W = 1.0, 1.0, 0.5
OMIT = "..."
_STOP = frozenset("a an and are as at be been but by did do does for from had has have he her hers him his how i if in "
                  "into is it its me my no not of on or our she so than that the their them then there they this to "
                  "was we were what when where which who whom why will with would you your".split())
_HEADER = re.compile(r"^\s*(session\b|#|date\b|\[?\d{4}-\d{2}-\d{2}|speaker\b|role\b)", re.IGNORECASE)


@dataclass
class EvidenceView:
    """One reference evidence snippet: ``turn_id``, ``text`` (the snippet), ``source`` (its
    session transcript with a header line), ``units`` (texts of that session's units)."""

    turn_id: str
    text: str
    source: str
    units: list[str]


@dataclass
class CaseMaterial:
    """Everything a case shows (see the module doc). ``score`` in [0, 1]; ``query`` the plan."""

    task_id: str
    primary: str | None
    secondary: tuple[str, ...]
    question: str
    answer: str
    prediction: str | None
    score: float
    query: dict | None
    retrieved: str
    evidence: list[EvidenceView] = field(default_factory=list)
    rubric: tuple[str, ...] = ()


def stem_tokens(text: str) -> set[str]:
    """Porter-stemmed lower-case word tokens of ``text`` without stopwords."""
    from memgym.rewards.scoring.metrics import stem

    return {stem(w) for w in re.findall(r"[a-z0-9]+", text.lower()) if w not in _STOP}


def dice(a: set, b: set) -> float:
    """2|a ∩ b| / (|a| + |b|); 0.0 when both are empty."""
    return 2 * len(a & b) / (len(a) + len(b)) if (a or b) else 0.0


class _Sim:
    """Similarity of texts to weighted cues; embeds every distinct text once per batch."""

    def __init__(self, embedder, cues: list[tuple[str, float]]):
        self.embedder = embedder
        self.cues = [(c, w) for c, w in cues if c and c.strip() and w > 0]
        self.cue_tok = [stem_tokens(c) for c, _ in self.cues]
        self.cue_vec = self._vecs([c for c, _ in self.cues])

    def _vecs(self, texts: list[str]) -> np.ndarray:
        if not texts:
            return np.zeros((0, 1), dtype=np.float32)
        m = np.asarray(self.embedder.encode(list(texts)), dtype=np.float32)
        n = np.linalg.norm(m, axis=1, keepdims=True)
        return m / np.where(n > 0, n, 1.0)

    def matrix(self, spans: list[str]) -> np.ndarray:
        """(len(spans), len(cues)) similarities 0.75·cos + 0.25·dice."""
        if not spans or not self.cues:
            return np.zeros((len(spans), len(self.cues)), dtype=np.float32)
        cos = self._vecs(spans) @ self.cue_vec.T
        d = np.asarray([[dice(stem_tokens(s), t) for t in self.cue_tok] for s in spans], dtype=np.float32)
        return COS_W * cos + DICE_W * d

    @property
    def weights(self) -> np.ndarray:
        return np.asarray([w for _, w in self.cues], dtype=np.float32)


def split_records(text: str, budget: int = BUDGET) -> list[str]:
    """``text`` → records: lines, with a fenced code block kept as one record and lines longer
    than budget/4 that are not headers split into sentences. Empty lines are dropped."""
    out, fence = [], None
    for line in text.splitlines():
        if fence is not None:
            fence.append(line)
            if line.strip().startswith("```"):
                out.append("\n".join(fence))
                fence = None
            continue
        if line.strip().startswith("```"):
            fence = [line]
            continue
        if not line.strip():
            continue
        if len(line) > budget // 4 and not _HEADER.match(line):
            out += [s for s in re.split(r"(?<=[.!?])\s+", line) if s]
        else:
            out.append(line)
    if fence:
        out.append("\n".join(fence))
    return out


def select_spans(spans: list[str], sim: _Sim, budget: int, must: tuple[int, ...] = ()) -> list[int]:
    """Indices of ``spans`` chosen greedily (module doc) within ``budget`` characters (joined
    by newlines, omission markers counted), ``must`` first; returned in source order."""
    if not spans:
        return []
    m = sim.matrix(spans)
    w = sim.weights
    covered = np.zeros(len(w), dtype=np.float32)
    chosen: list[int] = []

    def cost(idx: list[int]) -> int:
        idx = sorted(idx)
        n = sum(len(spans[i]) + 1 for i in idx)
        gaps = (idx[0] > 0) + (idx[-1] < len(spans) - 1) + sum(1 for a, b in zip(idx, idx[1:]) if b != a + 1)
        return n + gaps * (len(OMIT) + 1)

    for i in must:
        if i not in chosen and cost(chosen + [i]) <= budget:
            chosen.append(i)
            if len(w):
                covered = np.maximum(covered, m[i])
    while True:
        best, best_gain = None, -1.0
        for i in range(len(spans)):
            if i in chosen:
                continue
            gain = float((w * np.maximum(0.0, m[i] - covered)).sum() + 0.1 * (w * m[i]).sum()) if len(w) else 0.0
            if gain > best_gain and cost(chosen + [i]) <= budget:
                best, best_gain = i, gain
        if best is None:
            break
        chosen.append(best)
        if len(w):
            covered = np.maximum(covered, m[best])
    return sorted(chosen)


def join_with_omissions(spans: list[str], chosen: list[int]) -> str:
    """The chosen spans in source order, ``...`` where spans were left out."""
    out, prev = [], -1
    for i in chosen:
        if i != prev + 1:
            out.append(OMIT)
        out.append(spans[i])
        prev = i
    if chosen and prev < len(spans) - 1:
        out.append(OMIT)
    return "\n".join(out)


def compact_text(text: str, sim: _Sim, budget: int = BUDGET, records: list[str] | None = None) -> str:
    """One excerpt: ``text`` unchanged when it fits, else the greedy selection."""
    if len(text) <= budget and records is None:
        return text
    spans = records if records is not None else split_records(text, budget)
    if sum(len(s) + 1 for s in spans) <= budget:
        return "\n".join(spans)
    return join_with_omissions(spans, select_spans(spans, sim, budget))


def _header(case: CaseMaterial) -> list[str]:
    labels = (case.primary or "?") + (f" (secondary {', '.join(case.secondary)})" if case.secondary else "")
    return [f"## Case {case.task_id} [{labels}] score {case.score:.2f}", f"Question: {case.question}",
            f"Reference answer: {case.answer}",
            *([f"Rubric (what the scorer reads): {' | '.join(case.rubric)}"] if case.rubric else []),
            f"Prediction: {case.prediction if case.prediction is not None else '-'}", f"Query plan: {case.query}"]


def render_full(case: CaseMaterial) -> str:
    """The uncompressed case (every text whole)."""
    lines = _header(case) + ["Retrieved:", case.retrieved or "(empty)", "Evidence view:"]
    for ev in case.evidence:
        lines += [f"- evidence {ev.turn_id}: {ev.text}", "  source:", ev.source, "  memory units:"]
        lines += [f"  * {u}" for u in ev.units] or ["  (none)"]
    return "\n".join(lines)


def render_compact(case: CaseMaterial, embedder, budget: int = BUDGET) -> tuple[str, dict]:
    """The compact case and its stats ``{"evidence": n, "best_unit_kept": n}``."""
    cues = [(" ".join([case.question, case.answer, *case.rubric]), QA_W)]
    n_ev = len(case.evidence)
    cues += [(ev.text, EVIDENCE_W / n_ev) for ev in case.evidence]
    if case.prediction:
        cues.append((case.prediction, PRED_W))
    sim = _Sim(embedder, cues)
    lines = _header(case) + ["Retrieved:", compact_text(case.retrieved or "(empty)", sim, budget), "Evidence view:"]
    shown: set[str] = set()
    kept = 0
    for ev in case.evidence:
        lines += [f"- evidence {ev.turn_id}: {ev.text}", "  source:", compact_text(ev.source, sim, budget),
                  "  memory units:"]
        if not ev.units:
            lines.append("  (none)")
            continue
        ev_sim = _Sim(embedder, [(ev.text, 1.0)])
        b = int(np.argmax(ev_sim.matrix(ev.units)[:, 0]))
        chosen = select_spans(ev.units, sim, budget, must=(b,))
        body = []
        for i in chosen:
            u = ev.units[i]
            body.append(f"  * {u}" if u not in shown else "  * (unit shown above)")
            shown.add(u)
        if b in chosen:
            kept += 1
        lines += body
        if len(chosen) < len(ev.units):
            lines.append(f"  {OMIT} ({len(ev.units) - len(chosen)} more units)")
    return "\n".join(lines), {"evidence": n_ev, "best_unit_kept": kept}


def case_from_run(task, trace, unit_text_fn) -> CaseMaterial:
    """A :class:`CaseMaterial` from a run's :class:`~memgym.rewards.scoring.summary.QuestionResult`
    and its :class:`~memgym.evolution.execution.results.ConversationTrace`; ``unit_text_fn(unit)``
    renders a unit dict."""
    conv = trace.conversation
    index = conv.turn_index
    sessions = {x.index: x for x in conv.sessions}
    units_of = {idx: [unit_text_fn(u) for u in us] for idx, us in zip(trace.session_index, trace.units)}
    ev = []
    for turn_id in dict.fromkeys(task.qa.evidence):
        if turn_id not in index:
            continue
        sidx, turn = index[turn_id]
        s = sessions[sidx]
        date = s.date_text or (s.date.isoformat() if s.date else "unknown date")
        source = f"Session {s.index} ({date})\n" + "\n".join(
            f"[{t.id}] {t.speaker}: {t.text}" + (f" [image: {t.image_caption}]" if t.image_caption else "")
            for t in s.turns)
        ev.append(EvidenceView(turn_id, turn.text or turn.image_caption or "", source, units_of.get(sidx, [])))
    qa = task.qa
    return CaseMaterial(f"{task.conversation}/{qa.id}", qa.capability.value if qa.capability else None,
                        tuple(c.value for c in qa.secondary), qa.question, str(qa.answer), task.prediction, task.score,
                        task.query, task.retrieved, ev, tuple(qa.rubric))
