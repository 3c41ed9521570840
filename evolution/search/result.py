"""What :func:`memgym.evolution.search.evolve` returns: :class:`EvolveResult`.

SCORES below is the summary form ``{"overall": float, "by_capability": {"F": float, ...},
"by_category": {label: float}, "retrieved_chars": float}`` (the last two when known; scores
are the recipe's scorer, in [0, 1]).
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class FrozenProgram:
    """The program the run froze (:func:`memgym.evolution.search.select.freeze_choice`): ``id``, its
    ``source``, ``why`` it was frozen, the ``runner_up``'s id (None when alone)."""

    id: str
    source: str
    why: str
    runner_up: str | None


@dataclass(frozen=True)
class ProgramScores:
    """An archived or baseline program's valid and test SCORES (``test`` None when not run on
    test); ``id`` None for a baseline."""

    id: str | None
    valid: dict | None
    test: dict | None


@dataclass(frozen=True)
class EvolveResult:
    """A finished (or budget-stopped) run: the ``frozen`` program with its ``valid`` and
    ``test`` SCORES, the ``seed``'s, the capability ``specialists`` (letter → scores), the
    recipe's ``baselines`` (name → scores), ``stopped`` (why the run stopped early, else
    None), the ``run_dir`` and the full ``summary`` (summary.json's dict,
    :mod:`memgym.evolution.search.report`)."""

    frozen: FrozenProgram
    valid: dict
    test: dict | None
    seed: ProgramScores
    specialists: dict
    baselines: dict
    stopped: str | None
    run_dir: Path
    summary: dict


def build_result(state, fin: dict, rt=None) -> EvolveResult:
    """The :class:`EvolveResult` of ``state`` after the final runs ``fin`` (the
    :class:`~memgym.evolution.search.journal.FinalRecord`'s dict); ``rt``: the run's runtime (its run card)."""
    from memgym.evolution.search.report import build_summary

    s = build_summary(state, fin, rt)
    fr = s["frozen"]
    return EvolveResult(
        FrozenProgram(s["final_id"], state.source_of(s["final_id"]), fr["why"], fr["runner_up"]),
        s["final"]["valid"], s["final"]["test"], ProgramScores("seed", s["seed"]["valid"], s["seed"]["test"]),
        {c: ProgramScores(v["id"], v["valid"], v["test"]) for c, v in s["specialists"].items()},
        {n: ProgramScores(None, b["valid"], b["test"]) for n, b in s["baselines"].items()},
        s["stopped"], state.dir.root, s)
