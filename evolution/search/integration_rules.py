"""The pure rules of trace-guided integration (no engine, no run directory): paired
differential cases, the acceptance verdict, and blame (which specialist, and which of its
elements, a retry leaves out).

Source: docs/design.md § "Capability-driven evolution", step 3. Applied by :mod:`memgym.evolution.search.integrate`.
"""
from __future__ import annotations

import random
from typing import Callable

from memgym.evolution.search.archive import CAPABILITIES, Archive, Candidate
from memgym.evolution.search.elements import MergeError, split_program
from memgym.evolution.search.select import TaskInfo

DEFAULT_DELTA = 0.02
_EPS = 1e-9



def paired_case(archive: Archive, cap: str, train_tasks: list[TaskInfo],
                base_id: str | None = None) -> tuple[str, float] | None:
    """(task id, gap) of ``cap``'s paired differential case, or None when ``cap`` has no
    specialist other than the base or no primary-``cap`` train task. gap = specialist's
    train score − base's (may be ≤ 0 when the specialist won on valid but not on train).
    ``base_id``: the program merged onto (default the archive's base)."""
    base_id = base_id or archive.base
    spec_id = archive.specialists.get(cap)
    if spec_id is None or spec_id == base_id:
        return None
    spec, base = archive.get(spec_id), archive.get(base_id)
    pool = [t for t in train_tasks if t.primary == cap]
    if not pool:
        return None
    gaps = [(spec.train.tasks.get(t.id, 0.0) - base.train.tasks.get(t.id, 0.0), -i, t.id) for i, t in enumerate(pool)]
    g, _, tid = max(gaps)
    return tid, g


def paired_cases(archive: Archive, train_tasks: list[TaskInfo], rng: random.Random | None = None,
                 random_draw: bool = False, only: set | None = None, base_id: str | None = None) -> dict[str, dict]:
    """capability → ``{"task", "gap", "specialist"}`` for every capability whose specialist
    differs from the base (and is in ``only`` when given), in F, T, P, M, A order.
    ``random_draw`` (ablation ``random_cases``): the task is ``rng.choice`` over all train
    tasks (gap still reported)."""
    out = {}
    base = archive.get(base_id or archive.base)
    for cap in CAPABILITIES:
        if only is not None and archive.specialists.get(cap) not in only:
            continue
        hit = paired_case(archive, cap, train_tasks, base.id)
        if hit is None:
            continue
        tid, gap = hit
        spec = archive.specialist(cap)
        if random_draw:
            tid = rng.choice([t.id for t in train_tasks])
            gap = spec.train.tasks.get(tid, 0.0) - base.train.tasks.get(tid, 0.0)
        out[cap] = {"task": tid, "gap": gap, "specialist": spec.id}
    return out


def integration_verdict(merged_overall: float, merged_caps: dict[str, float], base_overall: float,
                        base_caps: dict[str, float], delta: float = DEFAULT_DELTA) -> tuple[bool, str, dict]:
    """(accepted, reason, drops): accepted when ``merged_overall > base_overall`` and no
    capability of the base drops by more than ``delta`` (a drop of exactly δ is allowed; a
    capability missing from the merged scores counts as 0). ``drops``: capability → base −
    merged for every capability that dropped (> 0). ``reason`` is "" when accepted, else the
    first failed condition with numbers."""
    drops = {c: base_caps[c] - merged_caps.get(c, 0.0) for c in base_caps
             if base_caps[c] - merged_caps.get(c, 0.0) > _EPS}
    if not merged_overall > base_overall + _EPS:
        return False, f"valid overall {merged_overall:.4f} does not beat the base's {base_overall:.4f}", drops
    worst = worst_drop(drops, delta)
    if worst is not None:
        also = sorted(c for c, d in drops.items() if d > delta + _EPS and c != worst)
        return False, (f"capability {worst} drops {drops[worst]:.4f} > delta {delta:g} against the base"
                       + (f" (also {', '.join(also)})" if also else "")), drops
    return True, "", drops


def blame(contributors: list[Candidate], drops: dict[str, float], delta: float) -> str | None:
    """The specialist an offline retry leaves out (module doc): the contributor with the
    lowest valid score on the capability that dropped most beyond δ, else the one with the
    lowest valid overall. Ties: the later one in ``contributors``. None when empty."""
    if not contributors:
        return None
    cap = worst_drop(drops, delta)
    if cap is not None:
        return min(reversed(contributors), key=lambda s: s.valid.by_capability.get(cap, 0.0)).id
    return min(reversed(contributors), key=lambda s: s.valid.overall).id


def common_ancestor(archive: Archive, a: str, b: str) -> str:
    """The deepest program in both lineages (the seed at worst)."""
    la = [c.id for c in archive.lineage(a)]
    lb = {c.id for c in archive.lineage(b)}
    return next(cid for cid in reversed(la) if cid in lb)


def worst_drop(drops: dict[str, float], delta: float) -> str | None:
    """The capability that dropped most beyond ``delta`` (ties: the earlier letter), else None."""
    over = {c: d for c, d in drops.items() if d > delta + _EPS}
    if not over:
        return None
    return max(over, key=lambda c: (over[c], -CAPABILITIES.index(c) if c in CAPABILITIES else 0))


def step_elements(parent_source: str, child_source: str) -> set[str]:
    """Keys of the elements (:mod:`memgym.evolution.search.elements`) one lineage step changed, added
    or removed, imports and other unnamed statements left out (a retry keeps those: an unused
    import is harmless, a missing one breaks the program). Empty when a side cannot be split."""
    try:
        a, b = split_program(parent_source).element_map(), split_program(child_source).element_map()
    except MergeError:
        return set()
    named = {k for k in set(a) | set(b) if _named_key(k)}
    return {k for k in named if (a[k].norm if k in a else None) != (b[k].norm if k in b else None)}


def _named_key(key: str) -> bool:
    names = key.removeprefix("Memory.").removeprefix("def ").removeprefix("class ").split(",")
    return all(n.isidentifier() for n in names)


def blame_elements(archive: Archive, source_of: Callable[[str], str], spec_id: str, ancestor_id: str,
                   supplied: set[str], cap: str | None) -> tuple[str, list[str]] | None:
    """The elements of specialist ``spec_id`` an element-level retry leaves out: those it
    ``supplied`` to the failed merge that were changed by its **worst lineage step** since
    ``ancestor_id`` (its common ancestor with the program merged onto). A step's worth is its
    valid score change against its own parent on ``cap`` (the capability that dropped most
    beyond δ), or on the overall score when ``cap`` is None; the lowest change is the worst
    (ties: the later step). Returns (step id, sorted keys), or None when no step of the
    specialist supplied an element (then the whole specialist is left out)."""
    line = [c.id for c in archive.lineage(spec_id)]
    steps = line[line.index(ancestor_id) + 1:] if ancestor_id in line else line[1:]
    best = None
    for sid in steps:
        c = archive.get(sid)
        p = archive.get(c.parent)
        keys = step_elements(source_of(p.id), source_of(c.id)) & supplied
        if not keys or c.valid is None or p.valid is None:
            continue
        worth = (c.valid.overall - p.valid.overall) if cap is None else \
            (c.valid.by_capability.get(cap, 0.0) - p.valid.by_capability.get(cap, 0.0))
        if best is None or worth <= best[0] + _EPS:
            best = (worth, sid, sorted(keys))
    return None if best is None else (best[1], best[2])
