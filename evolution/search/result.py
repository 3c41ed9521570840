"""What :func:`memgym.evolution.search.evolve` returns: :class:`EvolveResult`.

SCORES below is the summary form ``{"overall": float, "by_capability": {"F": float, ...},
"by_category": {label: float}, "retrieved_chars": float}`` (the last two when known; scores
are the recipe's scorer, in [0, 1]).
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path


@dataclass(frozen=True)
class FrozenProgram:
    """The program the run froze (:func:`memgym.evolution.search.select.freeze_choice`): ``id``, its
    ``source``, ``why`` it was frozen, the ``runner_up``'s id (None when alone) and the ``pool``
    chosen from (``[{"id", "roles", "valid"}]``)."""

    id: str
    source: str
    why: str
    runner_up: str | None
    pool: list = field(default_factory=list)


@dataclass(frozen=True)
class ProgramScores:
    """An archived or baseline program's valid and test SCORES (``test`` None when not run on
    test); ``id`` None for a baseline; ``error``: why a baseline could not run."""

    id: str | None
    valid: dict | None
    test: dict | None
    error: str | None = None


@dataclass(frozen=True)
class EvolveResult:
    """A finished (or budget-stopped) run: the ``frozen`` program with its ``valid`` and
    ``test`` SCORES, the ``seed``'s, the capability ``specialists`` (letter → scores), the
    recipe's ``baselines`` (name → scores), ``stopped`` (why the run stopped early, else
    None), the ``run_dir`` and ``summary``, summary.json's dict written from the fields above
    (:func:`memgym.evolution.search.report.build_summary`)."""

    frozen: FrozenProgram
    valid: dict
    test: dict | None
    seed: ProgramScores
    specialists: dict
    baselines: dict
    stopped: str | None
    run_dir: Path
    summary: dict = field(default_factory=dict)


def build_result(state, fin: dict, rt=None) -> EvolveResult:
    """The :class:`EvolveResult` of ``state`` after the final runs ``fin`` (the
    :class:`~memgym.evolution.search.journal.FinalRecord`'s dict), scores read from the archive
    and ``fin``; its summary written from it; ``rt``: the run's runtime (its run card)."""
    from memgym.evolution.search.archive import CAPABILITIES
    from memgym.evolution.search.report import build_summary, split_scores_form, test_of

    arch = state.archive
    final, fr = arch.get(fin["final"]), state.freeze()
    specs = {c: arch.specialist(c) for c in CAPABILITIES if c in arch.specialists}
    result = EvolveResult(
        FrozenProgram(final.id, state.source_of(final.id), fr["why"], fr["runner_up"], fr["pool"]),
        final.valid.scores(), split_scores_form(fin.get("final_test")),
        ProgramScores("seed", arch.get("seed").valid.scores(), split_scores_form(fin.get("seed_test"))),
        {c: ProgramScores(p.id, p.valid.scores(), split_scores_form(test_of(fin, p.id))) for c, p in specs.items()},
        {n: ProgramScores(None, split_scores_form(b.get("valid")), split_scores_form(b.get("test")), b.get("error"))
         for n, b in (fin.get("baselines") or {}).items()},
        state.stopped, state.dir.root)
    return replace(result, summary=build_summary(state, result, fin, rt))
