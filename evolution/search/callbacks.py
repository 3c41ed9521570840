"""The engine's own callbacks (:class:`memgym.evolution.search.protocols.Callback`): the run
directory's writer, the rounds' progress bar and the reports. :func:`memgym.evolution.search.api.evolve`
puts them first, in this order, before a caller's callbacks.
"""
from __future__ import annotations

import dataclasses

from memgym.evolution.search.journal import FinalRecord, OutcomeRecord, final_path, record_path
from memgym.evolution.search.protocols import Callback
from memgym.evolution.search.rundir import atomic_write_json, atomic_write_text


class RunDirWriter(Callback):
    """Persists the run (layout: :mod:`memgym.evolution.search.rundir`): ``recipe.json`` (``recipe``,
    the recipe as given, on a fresh start), every journal record as
    ``candidates/<id>/<step>.json``, a candidate's ``program.py`` (and ``seed.py``) with its
    outcome, ``final.json``, ``state.json`` after every round and at the end, ``best.py``."""

    def __init__(self, recipe=None):
        self.recipe = recipe

    def on_run_start(self, state, resumed: bool) -> None:
        if self.recipe is not None and not state.dir.recipe.exists():
            atomic_write_json(state.dir.recipe, dataclasses.asdict(self.recipe))

    def on_record(self, state, record) -> None:
        root = state.dir.root
        if isinstance(record, FinalRecord):
            atomic_write_json(final_path(root), record.to_json())
            return
        if record.step is None:  # an integration attempt: booked in state.json's history
            return
        if isinstance(record, OutcomeRecord) and record.candidate in state.sources:
            atomic_write_text(state.dir.cand(record.candidate) / "program.py", state.sources[record.candidate])
            if record.candidate == "seed":
                atomic_write_text(root / "seed.py", state.sources["seed"])
        atomic_write_json(record_path(root, record.candidate, record.step), record.to_json())

    def on_round_end(self, state, round_no: int) -> None:
        state.save()

    def on_run_end(self, state, result) -> None:
        atomic_write_text(state.dir.root / "best.py", result.frozen.source)
        state.save()


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


class ReportWriter(Callback):
    """summary.json, report.md, capabilities.png and boundary.png at the end
    (:func:`memgym.evolution.search.report.write_reports`)."""

    def on_run_end(self, state, result) -> None:
        from memgym.evolution.search.report import write_reports

        write_reports(state, result.summary)
