"""The contracts of the evolution engine's plug-ins (GEPA's adapter + callback split): the engine
imports these types and the plug-ins implement them, so the engine never depends on a plug-in.
"""
from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol

if TYPE_CHECKING:
    from memgym.evolution.search.archive import Archive, Candidate
    from memgym.evolution.search.config import EvolveConfig
    from memgym.evolution.search.proposers.base import ProposalInput, ProposalResult
    from memgym.evolution.search.select import TaskInfo


class Proposer(Protocol):
    """Proposes a child program. ``propose(inp, rng)``: ``rng`` is the run's seeded generator (the
    only randomness allowed). ``revise(...)``: once after a failed validation level; None = no
    second try. ``needs_cases`` (default True): False skips rendering compact cases. Optional
    ``exhausted(inp) -> bool``: nothing left to try on that parent."""

    name: str
    needs_cases: bool

    def propose(self, inp: ProposalInput, rng: random.Random) -> ProposalResult: ...

    def revise(self, inp: ProposalInput, result: ProposalResult, verdict: str,
               rng: random.Random) -> ProposalResult | None: ...


class TargetPolicy(Protocol):
    """Which capability a refinement round targets (None: no target)."""

    name: str

    def choose(self, archive: Archive, valid_tasks: list[TaskInfo], round_no: int,
               rng: random.Random) -> str | None: ...


class ParentPolicy(Protocol):
    """Which archived program a round refines (optional ``fallbacks(archive, target)``: the
    next parents to try when the proposer is exhausted on the first)."""

    name: str

    def choose(self, archive: Archive, target: str | None) -> Candidate: ...


class CasePolicy(Protocol):
    """Which ``k`` train task ids a proposal is shown as compact cases."""

    name: str

    def choose(self, archive: Archive, parent: Candidate, target: str | None, train_tasks: list[TaskInfo], k: int,
               rng: random.Random) -> list[str]: ...


class AcceptancePolicy(Protocol):
    """What an evaluated child becomes: updates the archive's roles and returns a description
    ("" = not accepted)."""

    name: str

    def accept(self, archive: Archive, cand: Candidate, stage: str, parent: Candidate) -> str: ...


@dataclass(frozen=True)
class Strategy:
    """One search strategy (PrisMem Table 4: the full method or an ablation). ``one_stage``: every
    round is this stage (None: cold → refine → integrate); ``integrate``: stage III runs;
    ``random_paired``: the integration's paired cases are drawn at random."""

    name: str
    target: TargetPolicy
    parent: ParentPolicy
    cases: CasePolicy
    acceptance: AcceptancePolicy
    one_stage: str | None = None
    integrate: bool = True
    random_paired: bool = False

    @property
    def specialists(self) -> bool:
        """Whether the run keeps capability specialists (False for a one-stage strategy)."""
        return self.one_stage is None

    def run_config(self, cfg: EvolveConfig) -> EvolveConfig:
        """The recipe as this strategy runs it (same number of proposals as the full method)."""
        if self.one_stage is not None:
            return dataclasses.replace(cfg, rounds_cold=cfg.total_rounds, rounds_refine=0, rounds_integrate=0)
        if not self.integrate:
            return dataclasses.replace(cfg, rounds_integrate=0)
        return cfg

    def stage_of(self, round_no: int, cfg: EvolveConfig) -> str:
        """The stage of round ``round_no`` (1-based) under the run config ``cfg``."""
        if self.one_stage is not None:
            return self.one_stage
        c, r = cfg.rounds_cold, cfg.rounds_refine
        return "cold" if round_no <= c else "refine" if round_no <= c + r else "integrate"


@dataclass(frozen=True)
class RoundSteps:
    """What the engine lends an integrator: ``attempt(round_no, stage, parent, target, inp, cid,
    proposer=None) -> Candidate`` (:meth:`Engine.attempt`), ``case_texts(source, task_ids)``."""

    attempt: Callable
    case_texts: Callable
    proposer_name: str


class Integrator(Protocol):
    """Stage III: ``run_round(state, steps, round_no, rng)`` makes and books one integration
    attempt on the :class:`~memgym.evolution.search.state.EvolutionState` (through
    ``state.record_round`` / ``state.log_row``); ``final(state)``: the integration's program id."""

    name: str

    def run_round(self, state, steps: RoundSteps, round_no: int, rng: random.Random) -> None: ...

    def final(self, state) -> str: ...


class Callback:
    """Observer of a run; subclass and override what you need (every method is a no-op).
    Called in list order, after the run has written what it is told about (journal records,
    the checkpoint after a round, best.py and the reports at the end).

    - ``on_run_start(state, resumed)``: the state is built (restored when ``resumed``);
    - ``on_round_start(state, round_no)`` / ``on_round_end(state, round_no)`` (round 0: the
      seed); ``on_loop_end(state)``: the rounds are over (also when one raised);
    - ``on_record(state, record)``: a new journal record
      (:mod:`memgym.evolution.search.journal`: proposal, validation, evaluation, a round's
      outcome; the archive's integration attempts); records replayed on resume are not re-sent;
    - ``on_run_end(state, result)``: the finished run's
      :class:`~memgym.evolution.search.api.EvolveResult`.
    """

    def on_run_start(self, state, resumed: bool) -> None: ...

    def on_round_start(self, state, round_no: int) -> None: ...

    def on_record(self, state, record) -> None: ...

    def on_round_end(self, state, round_no: int) -> None: ...

    def on_loop_end(self, state) -> None: ...

    def on_run_end(self, state, result) -> None: ...
