"""Contribution attribution: which memory part the session's questions drew on.

Source: MemBuilder (arXiv 2601.05488) Eqs. 9-10; docs/design.md § "Dense session reward and ADRPO"
step 6. ``h(m)`` = retrieved entries of part m over the J questions; the dominant part is
``argmax h`` over episodic/semantic/procedural, and a tie (incl. all zeros) means none.
``w(m) = α`` for the dominant part, else 1; core is never dominant (always shown), w(core) = 1.
"""
from __future__ import annotations

from collections.abc import Sequence

from memgym.memory_bank.actions import MANAGERS, PARTS

__all__ = ["part_counts", "dominant_part", "contribution_weight"]


def part_counts(retrieved: Sequence, correct: Sequence[bool] | None = None) -> dict[str, int]:
    """``h(m)`` per part from one ``Retrieved`` (anything with ``counts``) per question; with
    ``correct`` only flagged questions count. Raises ValueError when the lengths differ.
    """
    if correct is not None and len(correct) != len(retrieved):
        raise ValueError(f"part_counts: {len(retrieved)} retrievals but {len(correct)} correctness flags")
    h = {p: 0 for p in PARTS}
    for j, r in enumerate(retrieved):
        if correct is not None and not correct[j]:
            continue
        for p in PARTS:
            h[p] += int(r.counts.get(p, 0))
    return h


def dominant_part(counts: dict[str, int]) -> str | None:
    """The part with the strictly largest count, or None on a tie for the maximum (so also
    when every count is 0). Raises ValueError for a missing part or a negative count."""
    for p in PARTS:
        if p not in counts or counts[p] < 0:
            raise ValueError(f"dominant_part: need a count >= 0 for each of {PARTS}, got {counts!r}")
    best = max(counts[p] for p in PARTS)
    winners = [p for p in PARTS if counts[p] == best]
    return winners[0] if len(winners) == 1 else None


def contribution_weight(manager: str, dominant: str | None, alpha: float) -> float:
    """``w(m) = alpha`` if ``manager == dominant`` else 1.0 (core always 1.0).

    Raises ValueError for an unknown manager or ``alpha <= 0``."""
    if manager not in MANAGERS:
        raise ValueError(f"unknown manager {manager!r}; expected one of {MANAGERS}")
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0, got {alpha}")
    return float(alpha) if manager != "core" and manager == dominant else 1.0
