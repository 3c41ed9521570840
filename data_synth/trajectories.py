"""Expert memory-construction trajectories (``memgym synth trajectories``).

Source: ``DESIGN.md`` § "The memory bank and its action space" (trajectory format, replay
reproduces the bank exactly) and § "Dense session reward and ADRPO" (SFT targets and the
expert bank behind every reward sample).

For each conversation, session by session, the four managers' prompts are built from the
expert's own bank so far (:func:`memory_bank.prompts.build_prompt`, the prompts used at
inference and in training) and sent to the expert in one batch. Each output is parsed,
validated and applied to a copy of the bank. An invalid output is retried up to
``max_tries`` attempts in all, each retry showing the expert its previous output and the
error. Rules beyond the action space:

- the core block may not grow past :data:`memory_bank.bank.CORE_LIMIT_CHARS` characters:
  such an output is invalid (``core_over_limit``) and the retry asks for a REWRITE to at most
  :data:`~memory_bank.bank.CORE_TARGET_CHARS`. Replay applies no compressor, so a
  compression step that is not itself in the file would break "replay reproduces the bank";
- a session whose managers still fail after ``max_tries`` is recorded as failed in the
  summary and the run stops that conversation there (later sessions would be built on a
  bank that lacks it); a re-run retries it.

Each line is written in canonical form (``ops_to_json``) and validated by replay — parsed by
:func:`data_synth.expert.parse_step` and applied to the bank with
:func:`~data_synth.expert.apply_step` — before it is appended. The file is resumable like
``synth qa`` (:mod:`data_synth.jsonl`): a re-run replays the lines already written to
rebuild each bank and continues after the last finished session.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from data_synth.expert import TrajectoryError, apply_step, parse_step
from data_synth.jsonl import ResumableJsonl
from llm.base import CallTally, GenerationParams
from memory_bank.action_schemas import prompt_schema
from memory_bank.actions import MANAGERS, ops_to_json, parse_output
from memory_bank.bank import CORE_LIMIT_CHARS, CORE_TARGET_CHARS, MemoryBank
from memory_bank.errors import ManagerOutputError
from memory_bank.prompts import build_prompt
from memory_bank.schema import Conversation, Session

__all__ = ["CoreOverLimitError", "SynthTrajectoryStats", "expert_session", "synth_trajectories"]


@dataclass
class SynthTrajectoryStats(CallTally):
    """Accounting of one run: sessions written / resumed, failed sessions
    (``{conversation_id, session, managers, errors}``), invalid outputs by error type,
    retries, and the expert's calls and tokens (cache hits excluded)."""

    sessions_written: int = 0
    sessions_resumed: int = 0
    failed: list[dict] = field(default_factory=list)
    invalid: Counter = field(default_factory=Counter)
    retries: int = 0
    repaired_bytes: int = 0

    def to_json(self) -> dict:
        d = dict(self.__dict__)
        d["invalid"] = dict(self.invalid)
        return d


class CoreOverLimitError(ManagerOutputError):
    """A core output that would grow the block past the character limit (no compressor runs
    while writing trajectories; see the module docstring)."""

    error_type = "core_over_limit"


def _check_output(manager: str, text: str, bank: MemoryBank, session: int, finish_reason: str | None = None):
    """Parsed ops of a valid output; raises ManagerOutputError (with ``error_type``; a cut-off
    completion is ``truncated``)."""
    ops = parse_output(manager, text, finish_reason)
    trial = bank.copy()
    trial.compressor = None
    trial.apply(manager, ops, session)
    if manager == "core" and len(trial.core) > CORE_LIMIT_CHARS:
        raise CoreOverLimitError(f"the core block would be {len(trial.core)} characters, over the "
                                 f"{CORE_LIMIT_CHARS} limit; REWRITE it to at most {CORE_TARGET_CHARS}", manager="core")
    return ops


def expert_session(backend, bank: MemoryBank, session: Session, embedder, params: GenerationParams,
                   max_tries: int, stats: SynthTrajectoryStats, constrained: bool = False
                   ) -> tuple[dict[str, dict], dict[str, str]]:
    """Run the four managers on one session with retries (``constrained``: each output decoded
    under its manager schema, ids narrowed to the shown ids; see :mod:`memory_bank.action_schemas`).

    Returns ``(outputs, errors)``: ``outputs[manager]`` = canonical JSON object of each valid
    output; ``errors[manager]`` = the last error of each manager that never produced one.
    ``bank`` is not modified."""
    prompts = {m: build_prompt(m, bank, session, embedder) for m in MANAGERS}
    messages = {m: prompts[m].messages for m in MANAGERS}
    outputs: dict[str, dict] = {}
    errors: dict[str, str] = {}
    pending = list(MANAGERS)
    for attempt in range(max_tries):
        if not pending:
            break
        stats.retries += len(pending) if attempt else 0
        if constrained:
            completions = backend.generate([messages[m] for m in pending], params,
                                           schemas=[prompt_schema(prompts[m]) for m in pending])
        else:
            completions = backend.generate([messages[m] for m in pending], params)
        failed = []
        for m, comp in zip(pending, completions):
            stats.book(comp)
            try:
                ops = _check_output(m, comp.text, bank, session.index, comp.finish_reason)
            except ManagerOutputError as e:
                stats.invalid[e.error_type] += 1
                errors[m] = f"{e.error_type}: {e}"
                messages[m] = messages[m] + [
                    {"role": "assistant", "content": comp.text},
                    {"role": "user", "content": f"That output is invalid ({e}). Reply with the corrected JSON object "
                                                "only."}]
                failed.append(m)
                continue
            outputs[m] = ops_to_json(m, ops)
            errors.pop(m, None)
        pending = failed
    return outputs, errors


def _resume_bank(conv: Conversation, records: list[dict], out_path) -> tuple[MemoryBank, int]:
    """Replay the lines already written for ``conv``; returns (bank, sessions done)."""
    mine = sorted((r for r in records if r.get("conversation_id") == conv.id), key=lambda r: r.get("session", 0))
    bank = MemoryBank()
    expected = [s.index for s in conv.sessions[: len(mine)]]
    if [r.get("session") for r in mine] != expected:
        raise TrajectoryError(out_path, 0, "session", f"{conv.id}: the file holds sessions "
                              f"{[r.get('session') for r in mine]}, not a prefix {expected} of the conversation")
    for i, rec in enumerate(mine, 1):
        apply_step(bank, parse_step(rec, out_path, i), out_path)
    return bank, len(mine)


def synth_trajectories(convs: list[Conversation], out_path, *, backend, embedder=None,
                       qa: dict[tuple[str, int], list[dict]] | None = None, max_tries: int = 3,
                       n_sessions: int | None = None, params: GenerationParams | None = None,
                       progress: bool = True, constrained: bool = False) -> SynthTrajectoryStats:
    """Write expert trajectory lines for ``convs`` to ``out_path`` (resumable).

    backend: the expert (:class:`llm.base.Backend`); embedder: ranks the entries each prompt
    shows (as at inference); qa: ``{(conversation_id, session): [{question, answer, evidence,
    kind}, ...]}`` copied into each line (``[]`` when absent); n_sessions: first N sessions
    only; params: default greedy with 1024 new tokens. Returns the run's stats (failed
    sessions are listed there, see the module docstring). Raises ValueError for
    ``max_tries < 1`` and TrajectoryError when the existing file does not replay.
    """
    if max_tries < 1:
        raise ValueError(f"max_tries must be >= 1, got {max_tries}")
    params = params or GenerationParams(max_new_tokens=1024, temperature=0.0)
    stats = SynthTrajectoryStats()
    with ResumableJsonl(out_path, lambda r: (r.get("conversation_id"), r.get("session"))) as log:
        stats.repaired_bytes = log.repaired_bytes
        for conv in convs:
            sessions = list(conv.sessions[:n_sessions] if n_sessions else conv.sessions)
            bank, done = _resume_bank(conv, log.records, out_path)
            stats.sessions_resumed += min(done, len(sessions))
            for session in tqdm(sessions[done:], desc=f"trajectories {conv.id}", unit="session",
                                disable=not progress):
                outputs, errors = expert_session(backend, bank, session, embedder, params, max_tries, stats,
                                                 constrained)
                if errors:
                    stats.failed.append({"conversation_id": conv.id, "session": session.index,
                                         "managers": sorted(errors), "errors": errors})
                    break
                line = {"conversation_id": conv.id, "session": session.index, "date": session.date_text,
                        **{m: outputs[m] for m in MANAGERS},
                        "qa": [dict(q) for q in (qa or {}).get((conv.id, session.index), [])]}
                trial = bank.copy()
                apply_step(trial, parse_step(line, out_path, len(log.records) + 1), out_path)  # replay check
                log.append(line)
                bank = trial
                stats.sessions_written += 1
    return stats
