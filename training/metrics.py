"""What a trained extractor's outputs are worth, counted one way everywhere: format failures
(:class:`FormatTally`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.errors import ManagerOutputError


@dataclass
class FormatTally:
    """Manager outputs and format failures (rejected by ``MemoryBank.apply_text``) per manager
    (``attempts``, ``failures``) and per error type (``by_type``).
    """

    attempts: dict[str, int] = field(default_factory=lambda: {m: 0 for m in MANAGERS})
    failures: dict[str, int] = field(default_factory=lambda: {m: 0 for m in MANAGERS})
    by_type: dict[str, int] = field(default_factory=dict)

    def add(self, manager: str, text: str, *, bank: MemoryBank | None = None, session: int = 1,
            finish_reason: str | None = None) -> str | None:
        """Count one output of ``manager``: applied to a copy of ``bank`` (default an empty
        bank; ``bank`` itself is never changed). Returns the error type of a failure, else None.
        Raises ValueError for an unknown manager."""
        if manager not in MANAGERS:
            raise ValueError(f"unknown manager {manager!r}; expected one of {MANAGERS}")
        self.attempts[manager] += 1
        trial = bank.copy() if bank is not None else MemoryBank()
        try:
            trial.apply_text(manager, text, session, finish_reason=finish_reason)
        except ManagerOutputError as e:
            self.failures[manager] += 1
            self.by_type[e.error_type] = self.by_type.get(e.error_type, 0) + 1
            return e.error_type
        return None

    def add_construction(self, built) -> None:
        """Add a :class:`memgym.memory_bank.construct.ConstructionResult`'s attempts and failures."""
        for m in MANAGERS:
            self.attempts[m] += built.attempts[m]
        for f in built.failures:
            self.failures[f.manager] += 1
            self.by_type[f.error_type] = self.by_type.get(f.error_type, 0) + 1

    def rate(self) -> dict[str, float | None]:
        """Per manager: failures / attempts in [0, 1]; None for a manager with no output."""
        return {m: (self.failures[m] / self.attempts[m] if self.attempts[m] else None) for m in MANAGERS}

    def overall(self) -> float | None:
        """All failures / all attempts (None when nothing was counted)."""
        n = sum(self.attempts.values())
        return sum(self.failures.values()) / n if n else None

