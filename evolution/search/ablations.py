"""Ablation switches of the evolution loop (PrisMem Table 4; DESIGN.md § "Capability-driven
evolution": "Ablations are switches").

Recipe field ``ablation``:

- ``none``: the full method (dependency-aware targets, history-guided cases, trace-guided
  integration);
- ``holistic``: M*'s loop, with no capability anywhere in the search. Every round (the
  recipe's cold + refine + integrate rounds, so the number of proposals matches the full
  method's) refines the program with the best valid **overall** score
  (:class:`BestOverallParent`), shows the lowest-scoring train tasks as cases
  (:class:`LowestScoreCases`), and a child becomes the new base only when the valid overall
  score improves. No specialists are kept, no integration runs; the final program is the base.
- ``round_robin``: refinement targets F, T, P, M, A in turn
  (:class:`evolution.search.select.RoundRobinTarget`, capabilities with valid tasks only);
- ``random_cases``: cases are train tasks drawn uniformly with the run's seeded RNG
  (:class:`evolution.search.select.RandomCases`) in every stage, including the integration's
  paired cases;
- ``no_integration``: the full method without stage III (``rounds_integrate`` taken as 0);
  the final program is the base.

:func:`build_evolution` is the one place a recipe becomes an :class:`Evolution` (``memgym
evolve`` and the experiment harness use it), so a resumed run rebuilds the same ablation.
"""
from __future__ import annotations

import dataclasses

from evolution.search.archive import Archive, Candidate
from evolution.search.config import EvolveConfig
from evolution.search.loop import Evolution
from evolution.search.select import (DependencyAwareTarget, HistoryGuidedCases, RandomCases, RoundRobinTarget,
                                     SpecialistParent)


class BestOverallParent:
    """Holistic parent: the evaluated program with the best valid overall score (ties: the
    earliest archived)."""

    name = "best_overall"

    def choose(self, archive: Archive, target) -> Candidate:
        best = None
        for c in archive.evaluated():
            if best is None or c.valid.overall > best.valid.overall:
                best = c
        return best


class LowestScoreCases:
    """Holistic cases: the ``k`` train tasks with the parent's lowest train scores (ties: task
    order), labels unused."""

    name = "lowest_scores"

    def choose(self, archive, parent, target, train_tasks, k, rng):
        scores = parent.train.tasks
        order = sorted(range(len(train_tasks)), key=lambda i: (scores.get(train_tasks[i].id, 0.0), i))
        return [train_tasks[i].id for i in order[:k]]


class OverallAcceptance:
    """Holistic acceptance: a child whose valid overall score beats the base's becomes the
    base; nothing else (no specialists)."""

    name = "overall"

    def accept(self, archive: Archive, cand: Candidate, stage: str, parent: Candidate) -> str:
        if cand.status != "evaluated" or not cand.valid.overall > archive.get(archive.base).valid.overall:
            return ""
        archive.base = cand.id
        cand.roles.append("base")
        return "base"


class HolisticEvolution(Evolution):
    """The ``holistic`` ablation's loop (module doc): stage ``holistic`` in every round, no
    specialists (the seed holds none either); acceptance by :class:`OverallAcceptance`."""

    def stage_of(self, round_no: int) -> str:
        return "holistic"

    def start(self) -> None:
        super().start()
        seed = self.state.archive.get("seed")
        self.state.archive.specialists = {}
        seed.roles = ["base"]
        self.state.history[-1]["accepted"] = "base"


def effective_config(cfg: EvolveConfig) -> EvolveConfig:
    """The recipe as the ablation runs it: ``holistic`` folds every round into holistic rounds
    (``rounds_cold`` = cold + refine + integrate, the others 0); ``no_integration`` sets
    ``rounds_integrate`` to 0; other ablations run the recipe unchanged."""
    if cfg.ablation == "holistic":
        return dataclasses.replace(cfg, rounds_cold=cfg.total_rounds, rounds_refine=0, rounds_integrate=0)
    if cfg.ablation == "no_integration":
        return dataclasses.replace(cfg, rounds_integrate=0)
    return cfg


def build_evolution(cfg: EvolveConfig, **kw) -> Evolution:
    """The :class:`Evolution` of a recipe with its ablation's policies (module doc). ``kw`` go
    to the constructor (``rt``, ``proposer``, ...; explicit policies win)."""
    run_cfg = effective_config(cfg)
    if cfg.ablation == "holistic":
        kw.setdefault("parent_policy", BestOverallParent())
        kw.setdefault("case_policy", LowestScoreCases())
        kw.setdefault("acceptance", OverallAcceptance())
        return HolisticEvolution(run_cfg, **kw)
    kw.setdefault("target_policy", RoundRobinTarget() if cfg.ablation == "round_robin" else DependencyAwareTarget())
    kw.setdefault("case_policy", RandomCases() if cfg.ablation == "random_cases" else HistoryGuidedCases())
    kw.setdefault("parent_policy", SpecialistParent())
    return Evolution(run_cfg, **kw)
