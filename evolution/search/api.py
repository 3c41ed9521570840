"""The public entry point of evolution: :func:`evolve` (GEPA's ``optimize``), the one way from a
recipe to a run for ``memgym evolve``, ``--resume``, ``memgym evolve experiment`` and users.

:func:`build_engine` is the composition root: the runtime (:func:`build_runtime`), the
strategy named by the recipe's ``ablation`` (:func:`memgym.evolution.search.strategies.strategy_for`),
the proposer (:func:`memgym.evolution.search.proposers.make_proposer` unless one is given), the
trace-guided integrator, the stage cache, the evaluator, the validation limits and the
run state with its callbacks: the proposer when it is a
:class:`~memgym.evolution.search.protocols.Callback` (``replay``),
:class:`ProgressBar`, then the caller's. What the run writes is not a callback: the state writes its
journal and checkpoints (:meth:`~memgym.evolution.search.state.EvolutionState.save`), the engine its
reports.
"""
from __future__ import annotations

from memgym.llm.errors import OutputPathError

import shutil
from pathlib import Path

from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.protocols import Callback
from memgym.evolution.search.result import EvolveResult
from memgym.evolution.search.rundir import LOCK_NAME, run_lock


class ProgressBar(Callback):
    """A tqdm bar over the run's rounds (off when the recipe's ``progress`` is False)."""

    def __init__(self):
        self.bar = None

    def on_round_start(self, state, round_no: int) -> None:
        if self.bar is None:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=state.cfg.total_rounds, initial=round_no - 1, desc="evolve rounds", unit="round",
                            disable=not state.cfg.progress)

    def on_round_end(self, state, round_no: int) -> None:
        if self.bar is not None:
            self.bar.update(1)

    def on_loop_end(self, state) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None


def build_runtime(cfg: EvolveConfig, root: str | Path):
    """The :class:`memgym.llm.runtime.Runtime` of a recipe: response cache ``cfg.cache`` (default
    ``root/responses.sqlite``); any embedder other than ``minilm`` from :func:`memgym.llm.embeddings.load_embedder`."""
    embedder = None
    if cfg.embedder != "minilm":
        from memgym.llm.embeddings import load_embedder
        embedder = load_embedder(cfg.embedder)
    return cfg.runtime(cache=str(Path(root) / "responses.sqlite"), embedder=embedder)


def build_engine(config: EvolveConfig, *, proposer=None, callbacks=(), rt=None):
    """The :class:`~memgym.evolution.search.engine.Engine` of recipe ``config`` with its collaborators
    (module doc); ``rt``: a shared runtime (default :func:`build_runtime`). Loads the splits."""
    from memgym.evolution.execution.sandbox import SandboxLimits
    from memgym.evolution.execution.stage_cache import StageCache
    from memgym.evolution.execution.validate import ValidationLimits
    from memgym.evolution.search.engine import Engine
    from memgym.evolution.search.evaluator import Evaluator
    from memgym.evolution.search.proposers import make_proposer
    from memgym.evolution.search.state import EvolutionState
    from memgym.evolution.search.strategies import strategy_for

    strategy = strategy_for(config.ablation)
    cfg = strategy.run_config(config)
    state = EvolutionState(cfg, [ProgressBar(), *callbacks], recipe=config)
    rt = rt if rt is not None else build_runtime(cfg, state.dir.root)
    integrator = None
    if cfg.rounds_integrate:
        from memgym.evolution.search.integrate import TraceGuidedIntegrator
        integrator = TraceGuidedIntegrator(cfg.delta, random_cases=strategy.random_paired,
                                           offline_first=cfg.integrate_offline_first, onto=cfg.integrate_onto,
                                           condition=cfg.integrate_condition)
    cache = StageCache() if cfg.stage_cache == "none" else StageCache(cfg.stage_cache or state.dir.root / "stages.sqlite")
    limits = ValidationLimits(
        sandbox=SandboxLimits(call_timeout_s=cfg.validate_timeout_s, load_timeout_s=max(10.0, cfg.validate_timeout_s)),
        probe_units=cfg.probe_units, probe_batches=cfg.probe_batches)
    proposer = proposer or make_proposer(cfg, rt, state.splits)
    if isinstance(proposer, Callback):  # e.g. replay, which checks each round against its recording
        state.callbacks.insert(0, proposer)
    return Engine(state, strategy, proposer, Evaluator(rt, cfg, cache, state.splits), limits, integrator)


def fresh_dir_problem(out: Path) -> str:
    """Why ``out`` cannot take a new run ("" when it can): it holds a run, or other files
    (:func:`memgym.llm.checks.out_dir_problem`)."""
    from memgym.llm.checks import out_dir_problem

    if (out / "state.json").exists() or (out / "recipe.json").exists():
        return f"{out} already holds a run; continue it with: memgym evolve --resume {out}"
    return out_dir_problem(out, what="memgym evolve run", own=(LOCK_NAME,),
                           writes="a run would overwrite report.md, best.py, summary.json and others there")


def _remove_new(out: Path, before: set[str], existed: bool) -> None:
    """Remove what a failed fresh start created in ``out`` (recipe.json, sqlite files, seed.py, ...)."""
    if not out.is_dir():
        return
    for p in out.iterdir():
        if p.name not in before:
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p, ignore_errors=True)
            else:
                p.unlink(missing_ok=True)
    if not existed:
        try:
            out.rmdir()
        except OSError:
            pass


def evolve(config: EvolveConfig, *, proposer=None, callbacks=(), resume: bool = False, rt=None) -> EvolveResult:
    """Run the evolution of recipe ``config`` in ``config.out`` and return its :class:`EvolveResult`
    (the run directory holds report.md, summary.json, best.py, ...).

    ``proposer``: any :class:`~memgym.evolution.search.protocols.Proposer` (default the recipe's);
    ``callbacks``: :class:`~memgym.evolution.search.protocols.Callback` objects, told after the run
    directory's writer; ``resume``: continue the run stored in ``config.out`` (replaying its
    journal) instead of starting one; ``rt``: a shared runtime. Holds the run directory's lock
    throughout. Raises FileExistsError when a fresh start finds a run or other files in
    ``config.out`` (a failed fresh start leaves nothing behind there), FileNotFoundError when
    there is nothing to resume, :class:`~memgym.evolution.search.rundir.RunLockedError` when another
    process works there, :class:`~memgym.evolution.search.rundir.RunStateError` for a damaged or
    mismatched run state, :class:`memgym.evolution.search.stops.EndpointUnreachable` (state saved)
    when the coder's endpoint keeps failing, ValueError when the seed program fails validation.
    """
    out = Path(config.out)
    before, existed = None, False
    if not resume:
        problem = fresh_dir_problem(out)
        if problem:
            raise OutputPathError(problem)
        existed = out.is_dir()
        before = {p.name for p in out.iterdir()} if existed else set()
    try:
        with run_lock(out):
            if before is not None and fresh_dir_problem(out):  # another process started one meanwhile
                problem, before = fresh_dir_problem(out), None
                raise OutputPathError(problem)
            engine = build_engine(config, proposer=proposer, callbacks=callbacks, rt=rt)
            return engine.run(resume=resume)
    except BaseException:
        if before is not None and not (out / "state.json").exists():
            _remove_new(out, before, existed)  # nothing ran: leave nothing that would block the corrected command
        raise
