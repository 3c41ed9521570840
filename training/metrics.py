"""What a trained extractor's outputs are worth, counted one way everywhere: format failures
(:class:`FormatTally`), bank size, the do-nothing reference reward and
the verbatim-copy rate of core writes.
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


def bank_size(bank: MemoryBank) -> dict[str, int]:
    """Entries per part (episodic, semantic, procedural) and ``core_chars`` (length of the core block)."""
    return {**bank.counts(), "core_chars": len(bank.core)}


def do_nothing_reward(samples, reward) -> dict:
    """``{"reward", "by_manager"}``: the mean reward of outputs that change nothing
    (``memgym.rewards.audit.EMPTY_OUTPUTS``) on ``rows``, the reference a validation reward is read against.
    """
    from memgym.rewards.audit import EMPTY_OUTPUTS
    from memgym.rewards.scoring.metrics import mean_or_zero

    bds = reward(list(samples), [EMPTY_OUTPUTS[s.manager] for s in samples])
    return {"reward": mean_or_zero([b.reward for b in bds]),
            "by_manager": {m: mean_or_zero([b.reward for s, b in zip(samples, bds) if s.manager == m])
                           for m in MANAGERS if any(s.manager == m for s in samples)}}


def core_copy_stats(outputs: dict[str, list[dict[str, str]]], convs, n: int = 6) -> dict:
    """Copy rate (:func:`memgym.rewards.copying.copy_rate`) of the core outputs that write text, against
    their conversation's built transcripts and their own earlier words.

    ``outputs``: ``{conversation id: [{manager: raw output}]}``; ``convs``: the conversations.
    Returns ``{"mean", "max", "n"}`` (None means without writes). Raises KeyError for a
    conversation ``convs`` lacks.
    """
    from memgym.memory_bank.actions import parse_core
    from memgym.memory_bank.errors import ManagerOutputError
    from memgym.rewards.copying import copy_rate
    from memgym.rewards.length import core_written_text

    by_id = {c.id: c for c in convs}
    rates = []
    for cid, steps in outputs.items():
        source = [s.transcript() for s in by_id[cid].sessions]
        for step in steps:
            text = step.get("core")
            if not text:
                continue
            try:
                written = core_written_text(parse_core(text))
            except ManagerOutputError:
                continue
            if written.strip():
                rates.append(copy_rate(written, source, n))
    return {"mean": sum(rates) / len(rates) if rates else None, "max": max(rates) if rates else None, "n": len(rates)}
