"""Search strategies by name: the full method and its ablations (PrisMem Table 4; docs/design.md §
"Capability-driven evolution": "Ablations are switches"). A strategy
(:class:`memgym.evolution.search.protocols.Strategy`) bundles the target, parent and case policies,
the acceptance rule and the stage schedule; the recipe's ``ablation`` names it
(:func:`strategy_for`, the one place the policies' defaults are set).

- ``none``: the full method (dependency-aware targets, the specialist as parent,
  history-guided cases, capability acceptance, trace-guided integration);
- ``holistic``: M*'s loop, with no capability anywhere in the search. Every round (the
  recipe's cold + refine + integrate rounds, so the number of proposals matches the full
  method's) refines the program with the best valid **overall** score
  (:class:`BestOverallParent`), shows the lowest-scoring train tasks as cases
  (:class:`LowestScoreCases`), and a child becomes the new base only when the valid overall
  score improves. No specialists are kept, no integration runs; the final program is the base.
- ``round_robin``: refinement targets F, T, P, M, A in turn
  (:class:`memgym.evolution.search.select.RoundRobinTarget`, capabilities with valid tasks only);
- ``random_cases``: cases are train tasks drawn uniformly with the run's seeded RNG
  (:class:`memgym.evolution.search.select.RandomCases`) in every stage, including the integration's
  paired cases;
- ``no_integration``: the full method without stage III (``rounds_integrate`` taken as 0);
  the final program is the base.
"""
from __future__ import annotations

from memgym.evolution.search.archive import Archive, Candidate
from memgym.evolution.search.config import ABLATIONS
from memgym.evolution.search.protocols import Strategy
from memgym.evolution.search.select import (CapabilityAcceptance, DependencyAwareTarget, HistoryGuidedCases, RandomCases,
                                     RoundRobinTarget, SpecialistParent)

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


def strategy_for(name: str) -> Strategy:
    """The :class:`Strategy` named ``name`` (module doc); ValueError naming the known ones."""
    if name == "holistic":
        return Strategy(name, DependencyAwareTarget(), BestOverallParent(), LowestScoreCases(), OverallAcceptance(),
                        one_stage="holistic", integrate=False)
    if name not in ABLATIONS:
        raise ValueError(f"unknown ablation {name!r}; choose from {', '.join(ABLATIONS)}")
    return Strategy(name, RoundRobinTarget() if name == "round_robin" else DependencyAwareTarget(), SpecialistParent(),
                    RandomCases() if name == "random_cases" else HistoryGuidedCases(), CapabilityAcceptance(),
                    integrate=name != "no_integration", random_paired=name == "random_cases")
