"""What a trained memory extractor's outputs are worth, counted the same way wherever they are
measured (:mod:`training.callbacks` inside the trainer, tests):

- :class:`FormatTally`: one manager output is a format failure when
  :meth:`memory_bank.bank.MemoryBank.apply_text` rejects it (not JSON, not the manager's schema,
  an id the bank lacks, cut off by the token limit); the rate is failures / outputs;
- :func:`bank_size`, :func:`validation_samples` (the validation reward rows, built as ADRPO
  builds its rows), :func:`do_nothing_reward` (the reference a validation reward is read
  against) and :func:`core_copy_stats` (verbatim copying of core writes).
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from memory_bank.actions import MANAGERS
from memory_bank.bank import MemoryBank
from memory_bank.errors import ManagerOutputError


@dataclass
class FormatTally:
    """Counts manager outputs and format failures, per manager and per error type.

    ``attempts[m]`` / ``failures[m]``: outputs / rejected outputs of manager m; ``by_type``:
    failures per ``ManagerOutputError.error_type`` (e.g. ``invalid_json``, ``truncated``)."""

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
        """Add a :class:`memory_bank.construct.ConstructionResult`'s attempts and failures."""
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


def validation_samples(trajectories: Sequence[str], *, sessions: Sequence[int] | None, max_prompt_tokens: int | None,
                       tokenizer, embedder, managers: Sequence[str] = MANAGERS, segment_tokens: int | None = None):
    """The reward rows of the validation trajectories (``training.adrpo_data.select_samples``
    over ``rewards.samples.build_reward_samples``, or over segment rows
    ``training.segment_samples.segment_reward_samples`` when ``segment_tokens`` is set), as
    ADRPO builds its training rows."""
    from training.adrpo import trajectory_paths
    from training.adrpo_data import select_samples
    from training.segment_samples import reward_rows

    samples = reward_rows(trajectory_paths(trajectories), tokenizer=tokenizer, embedder=embedder, managers=managers,
                          segment_tokens=segment_tokens)
    return select_samples(samples, sessions=sessions, max_prompt_tokens=max_prompt_tokens, tokenizer=tokenizer)


def do_nothing_reward(samples, reward) -> dict:
    """The reference a validation reward must be read against: the mean reward of the outputs
    that change nothing (``rewards.audit.EMPTY_OUTPUTS``) on the same rows, ``{"reward", "by_manager"}``.
    With the counterfactual bank the other parts are the expert's, so an empty output already
    scores the questions those parts answer (e.g. 0.882 on conv-30's segment rows of sessions
    1-2, vs 0.934 for the expert's own outputs)."""
    from rewards.audit import EMPTY_OUTPUTS
    from rewards.scoring.metrics import mean_or_zero

    bds = reward(list(samples), [EMPTY_OUTPUTS[s.manager] for s in samples])
    return {"reward": mean_or_zero([b.reward for b in bds]),
            "by_manager": {m: mean_or_zero([b.reward for s, b in zip(samples, bds) if s.manager == m])
                           for m in MANAGERS if any(s.manager == m for s in samples)}}


def core_copy_stats(outputs: dict[str, list[dict[str, str]]], convs, n: int = 6) -> dict:
    """Verbatim-copy rate (:func:`rewards.copying.copy_rate`, n-gram length ``n``) of the core
    outputs that write text, against the transcripts of the sessions they were built from.

    ``outputs``: ``{conversation id: [{manager: raw output}]}`` (e.g. ``ConstructionResult.outputs``,
    one dict per construction step); ``convs``: the same :class:`memory_bank.schema.Conversation`
    objects (cut to the sessions built). A core output counts when it parses
    (:func:`memory_bank.actions.parse_core`) to an APPEND / REPLACE / REWRITE with text; failed
    and NONE outputs write nothing and are left out. The source is every built session's
    transcript of that conversation (a segment's text is a part of it) and the output's own
    earlier words; the core block before the step is not replayed, so an APPEND that repeats it
    is not counted (the training reward counts it, ``SessionReward._copy_rates``).

    Returns ``{"mean", "max"}`` (in [0, 1], None when no output writes text) and ``"n"`` (writing
    outputs). Raises KeyError when ``outputs`` names a conversation ``convs`` lacks.
    Reference (measured, issue 17): the expert's conv-26 segment core writes 0.044.
    """
    from memory_bank.actions import parse_core
    from memory_bank.errors import ManagerOutputError
    from rewards.copying import copy_rate
    from rewards.length import core_written_text

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
