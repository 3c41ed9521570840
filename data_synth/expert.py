"""Expert memory-construction trajectories (JSONL, one line per session: ``{conversation_id,
session, date, core, episodic, semantic, procedural, qa}``): loading, validation by replay, and
an extractor that replays them."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from memgym.data_synth.jsonl import read_jsonl
from memgym.llm.errors import MemgymError
from memgym.memory_bank.actions import MANAGERS, parse_output
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.errors import ManagerOutputError

REQUIRED_KEYS = ("conversation_id", "session", "core", "episodic", "semantic", "procedural")


class TrajectoryError(MemgymError, ValueError):
    """A trajectory line that is malformed or does not replay. Names file, line and field."""

    kind = "data"

    def __init__(self, file, line: int, field: str, reason: str):
        super().__init__(f"{file}: line {line}, field '{field}': {reason}")
        self.file, self.line, self.field, self.reason = str(file), line, field, reason


@dataclass
class TrajectoryStep:
    """One session of a trajectory; ``outputs`` maps manager -> its JSON object."""

    conversation_id: str
    session: int
    date: str
    outputs: dict[str, dict]
    qa: list[dict] = field(default_factory=list)
    line: int = 0

    def output_text(self, manager: str) -> str:
        return json.dumps(self.outputs[manager], ensure_ascii=False)

    def to_json(self) -> dict:
        return {"conversation_id": self.conversation_id, "session": self.session, "date": self.date,
                **self.outputs, "qa": self.qa}


def parse_step(obj, file, line: int) -> TrajectoryStep:
    """Validate one decoded JSON line (keys and types; ops are checked by replay)."""
    if not isinstance(obj, dict):
        raise TrajectoryError(file, line, "<root>", f"expected a JSON object, got {type(obj).__name__}")
    for k in REQUIRED_KEYS:
        if k not in obj:
            raise TrajectoryError(file, line, k, "missing required key")
    for m in MANAGERS:
        if not isinstance(obj[m], dict):
            raise TrajectoryError(file, line, m, f"expected an object, got {type(obj[m]).__name__}")
    if not isinstance(obj["session"], int) or obj["session"] < 1:
        raise TrajectoryError(file, line, "session", f"expected a positive int, got {obj['session']!r}")
    qa = obj.get("qa", [])
    if not isinstance(qa, list):
        raise TrajectoryError(file, line, "qa", "expected a list")
    for j, q in enumerate(qa):
        if not isinstance(q, dict) or not {"question", "answer"} <= q.keys():
            raise TrajectoryError(file, line, f"qa[{j}]", "expected {question, answer, evidence, kind}")
    return TrajectoryStep(str(obj["conversation_id"]), obj["session"], str(obj.get("date", "")),
                          {m: obj[m] for m in MANAGERS}, qa, line)


def load_trajectories(path) -> list[TrajectoryStep]:
    """Read a trajectory JSONL file. Raises FileNotFoundError naming the path, or
    :class:`TrajectoryError` naming the line and field of the first broken line."""
    return [parse_step(obj, Path(path), i) for i, obj in read_jsonl(path, TrajectoryError, what="trajectory file")]


def apply_step(bank: MemoryBank, step: TrajectoryStep, file="<memory>") -> None:
    """Apply all four managers' outputs of ``step``; a failure names the line and manager.
    Atomic per manager (a failing manager leaves its part untouched)."""
    for m in MANAGERS:
        try:
            bank.apply(m, parse_output(m, step.output_text(m)), step.session)
        except ManagerOutputError as e:
            raise TrajectoryError(file, step.line, m, f"{e.error_type}: {e}") from None


def replay(path_or_steps, bank: MemoryBank | None = None, upto_session: int | None = None) -> MemoryBank:
    """Replay a trajectory into a bank (sessions in file order). ``upto_session`` stops after
    that session index. Raises :class:`TrajectoryError` on the first line that fails."""
    file = path_or_steps if isinstance(path_or_steps, (str, Path)) else "<steps>"
    steps = load_trajectories(path_or_steps) if isinstance(path_or_steps, (str, Path)) else path_or_steps
    bank = bank if bank is not None else MemoryBank()
    for step in steps:
        if upto_session is not None and step.session > upto_session:
            break
        apply_step(bank, step, file)
    return bank


def banks_before_sessions(steps: list[TrajectoryStep]) -> dict[tuple[str, int], MemoryBank]:
    """For every step, a copy of the expert bank as it stood *before* that session."""
    out, banks = {}, {}
    for step in steps:
        bank = banks.setdefault(step.conversation_id, MemoryBank())
        out[(step.conversation_id, step.session)] = bank.copy()
        apply_step(bank, step)
    return out


class ExpertExtractor:
    """Replays expert outputs as a model's (``expert:<file.jsonl>``); KeyError for a missing session."""

    def __init__(self, *paths):
        self.steps: dict[tuple[str, int], TrajectoryStep] = {}
        for p in paths:
            for s in load_trajectories(p):
                self.steps[(s.conversation_id, s.session)] = s
        self.name = "expert:" + ",".join(Path(p).name for p in paths)
        self.conversation_ids = sorted({c for c, _ in self.steps})

    def has(self, conversation_id: str, session: int) -> bool:
        return (conversation_id, session) in self.steps

    def missing_sessions(self, conv) -> list[int]:
        """Indices of ``conv``'s sessions this file has no line for (empty: it covers all)."""
        return [s.index for s in conv.sessions if not self.has(conv.id, s.index)]

    def extract(self, conversation_id, session, prompts):
        key = (conversation_id, session.index)
        if key not in self.steps:
            raise KeyError(f"{self.name} has no line for conversation {conversation_id}, session {session.index}")
        step = self.steps[key]
        return [step.output_text(p.manager) for p in prompts]

    def compressor(self):
        return None
