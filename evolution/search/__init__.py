"""The search layer of evolution: WHICH program to try next (PrisMem Algorithm 1).

:func:`evolve` (api) runs a recipe and returns an :class:`EvolveResult`; :mod:`protocols`
holds the plug-in contracts (proposer, policies, strategy, integrator, callback). archive
(candidates, base, specialists, lineage), select (target / parent / case policies),
strategies (the full method and its ablations by name), cases (compact diagnostic cases),
edits (SEARCH/REPLACE application), proposers (coder, params, scripted), ledger (tokens and
budgets per role), journal (typed step records), engine (cold start → capability refinement →
[integration] → frozen final), callbacks (run directory, progress, reports), report. Imports
:mod:`memgym.evolution.execution`, never the other way.
"""
from memgym.evolution.search.api import evolve  # noqa: F401
from memgym.evolution.search.protocols import Callback, Strategy  # noqa: F401
from memgym.evolution.search.result import EvolveResult, FrozenProgram, ProgramScores  # noqa: F401
