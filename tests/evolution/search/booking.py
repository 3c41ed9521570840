"""A run state without a run directory for the integrator tests: the real booking methods of
:class:`~memgym.evolution.search.state.EvolutionState` (round records, the archive's integration log)
over an in-memory archive; a subclass sets ``archive`` and ``history`` and reads the sources."""
from __future__ import annotations

from memgym.evolution.search.state import EvolutionState


class Booking:
    record = EvolutionState.record
    record_round = EvolutionState.record_round
    log_integration = EvolutionState.log_integration

    def emit(self, record) -> None:
        pass

    def notify(self, event: str, *args) -> None:
        pass
