"""The engine's own callback (:class:`memgym.evolution.search.protocols.Callback`): the rounds'
progress bar. :func:`memgym.evolution.search.api.evolve` puts it before a caller's callbacks. What
the run writes is not a callback: the state writes its journal and checkpoints
(:meth:`memgym.evolution.search.state.EvolutionState.save`), the engine its reports.
"""
from __future__ import annotations

from memgym.evolution.search.protocols import Callback


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
