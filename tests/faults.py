"""Fault injection for the kill -9 tests: run the memgym CLI in this process with a SIGKILL at a
named point, e.g. ``python -m tests.faults proposal:2 evolve --resume DIR``.

Points (``<point>:<round>``, or ``run_end:<variant>/seed<k>`` for an experiment):

- ``proposal:N``: right after round N's proposal is recorded (its record written);
- ``evaluation:N``: during round N's candidate evaluation, after the train split and before
  the valid split;
- ``round_end:N``: right after round N's state is saved;
- ``run_end:<variant>/seed<k>``: right after that experiment run is recorded as done.

The kill is a callback added to every :func:`memgym.evolution.search.api.evolve` call (after the
run's own callbacks, so what they write is on disk), plus, for ``evaluation``, a wrapper of
:meth:`Evaluator.evaluate`; production code knows nothing of it.
"""
from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

from memgym.evolution.search.protocols import Callback


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


class KillAt(Callback):
    """SIGKILL at ``point`` (module doc); ``out``: the run directory of this evolve call."""

    def __init__(self, point: str, out: str):
        self.what, self.arg = point.split(":", 1)
        self.out = Path(out)
        self.round = None

    def on_round_start(self, state, round_no: int) -> None:
        self.round = round_no

    def on_record(self, state, record) -> None:
        if self.what == "proposal" and record.kind == "proposal" and str(record.round) == self.arg:
            _kill()

    def on_round_end(self, state, round_no: int) -> None:
        self.round = None
        if self.what == "round_end" and str(round_no) == self.arg:
            _kill()

    def on_run_end(self, state, result) -> None:
        if self.what == "run_end" and self.out.as_posix().endswith("/" + self.arg):
            _kill()


def install(point: str) -> None:
    """Wrap :func:`memgym.evolution.search.api.evolve` (and the evaluator for ``evaluation``)."""
    from memgym.evolution.search import api
    from memgym.evolution.search.evaluator import Evaluator

    real = api.evolve
    active: list[KillAt] = []

    def evolve(config, **kw):
        cb = KillAt(point, config.out)
        active.append(cb)
        return real(config, **{**kw, "callbacks": [*kw.get("callbacks", ()), cb]})

    api.evolve = evolve
    if point.startswith("evaluation:"):
        evaluate = Evaluator.evaluate

        def wrapped(self, source, split, **kw):
            if split == "valid" and active and str(active[-1].round) == point.split(":", 1)[1]:
                _kill()
            return evaluate(self, source, split, **kw)

        Evaluator.evaluate = wrapped


if __name__ == "__main__":
    install(sys.argv[1])
    from memgym.launch.cli import main

    sys.exit(main(sys.argv[2:]))
