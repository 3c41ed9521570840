"""Expert memory-construction trajectories (``memgym synth trajectories``); format and "replay
reproduces the bank": ``docs/design.md`` § "The memory bank and its action space".

Per session, the four managers' prompts (:func:`memgym.memory_bank.prompts.build_prompt`) are built from
the expert's own bank and sent in one batch; each output is parsed and applied, an invalid one
retried (up to ``max_tries`` attempts, shown its previous output and error). A core output past
:data:`memgym.memory_bank.bank.CORE_LIMIT_CHARS` is invalid (``core_over_limit``: replay runs no
compressor). A session still failing stops its conversation (recorded; a re-run retries it).
Each line is validated by replay (:func:`memgym.data_synth.expert.parse_step` / ``apply_step``) before
it is appended; the file resumes like :mod:`memgym.data_synth.jsonl`.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from memgym.data_synth.expert import TrajectoryError, apply_step, parse_step
from memgym.data_synth.jsonl import ResumableJsonl
from memgym.llm.base import CallTally, GenerationParams
from memgym.memory_bank.action_schemas import prompt_schema
from memgym.memory_bank.actions import MANAGERS, ops_to_json, parse_output
from memgym.memory_bank.bank import CORE_LIMIT_CHARS, CORE_TARGET_CHARS, MemoryBank
from memgym.memory_bank.errors import ManagerOutputError
from memgym.memory_bank.prompts import build_prompt
from memgym.memory_bank.schema import Conversation, Session

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
    """A core output that would grow the block past the character limit."""

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
    """``(outputs, errors)`` of the four managers on one session, with retries: each valid
    output's canonical JSON, each failing manager's last error (``constrained``: decoded under
    :mod:`memgym.memory_bank.action_schemas`). ``bank`` is not modified."""
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
    """Write expert trajectory lines for ``convs`` to ``out_path`` (resumable); ``qa``:
    ``{(conversation_id, session): [item, ...]}`` copied into each line; ``params`` default greedy,
    1024 tokens. ValueError for ``max_tries < 1``, TrajectoryError when the file does not replay."""
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
