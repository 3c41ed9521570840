"""How much gold evidence a program loses to the context budget: the share of evidence turns that
the program retrieves for themselves but that the budget's cut removes.

Source: docs/design.md § "Judges and scoring" (one context budget for every program,
:mod:`memgym.rewards.scoring.context_budget`). Read from a diagnostics run's probes
(:class:`memgym.evolution.execution.results.ConversationTrace.probes`: what ``retrieve`` returned with each
evidence turn's own text as the query). For every train task and each evidence turn e with a probe:

- e is **found** when its marker (the turn's text, whitespace collapsed, first
  :data:`MARKER_CHARS` characters) occurs in the probe (whitespace collapsed);
- e is **cut** when it is found but the marker no longer occurs in the probe cut to the budget
  (:meth:`ContextBudget.cut`).

``share`` = cut / found per capability (primary label) and overall, in [0, 1]; None where
nothing was found. A task counts each distinct evidence turn once; a turn shared by several
tasks counts for each. The params proposer weighs budget variants by this share
(:mod:`memgym.evolution.search.proposers.params`).
"""
from __future__ import annotations

MARKER_CHARS = 40


def _collapse(text: str) -> str:
    return " ".join(text.split())


def evidence_cut(run, budget) -> dict | None:
    """``{capability | "overall": {"found": int, "cut": int, "share": float | None}}`` for a
    :class:`~memgym.evolution.execution.results.ProgramRun` with probes, under ``budget`` (an object
    with ``cut(text) -> str``). None when ``budget`` is None (no budget: nothing is cut) or
    the run has no probes (a run without diagnostics)."""
    if budget is None or not any(tr.probes for tr in run.traces):
        return None
    traces = {tr.conversation.id: tr for tr in run.traces}
    memo: dict[tuple[str, str], tuple[bool, bool]] = {}
    counts: dict[str, list[int]] = {}
    for task in run.tasks:
        tr = traces[task.conversation]
        index = tr.conversation.turn_index
        cap = task.qa.capability.value if task.qa.capability is not None else "?"
        for turn_id in dict.fromkeys(task.qa.evidence):
            if turn_id not in index or turn_id not in (tr.probes or {}):
                continue
            key = (tr.conversation.id, turn_id)
            if key not in memo:
                turn = index[turn_id][1]
                marker = _collapse(turn.text or turn.image_caption or "")[:MARKER_CHARS]
                probe = tr.probes[turn_id]
                found = bool(marker) and marker in _collapse(probe)
                memo[key] = (found, found and marker not in _collapse(budget.cut(probe)))
            found, cut = memo[key]
            for c in (cap, "overall"):
                row = counts.setdefault(c, [0, 0])
                row[0] += found
                row[1] += cut
    return {c: {"found": f, "cut": k, "share": (k / f if f else None)} for c, (f, k) in counts.items()}
