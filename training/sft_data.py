"""SFT examples from expert trajectories: one per manager per session, the prompt built by
:func:`memgym.memory_bank.prompts.build_prompt` over the replayed expert bank before the session,
the completion the expert's JSON (TRL conversational prompt-completion format). An example
longer than ``max_length`` is dropped whole (:func:`drop_overlong`), never truncated.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from memgym.data_synth.datasets import conversations_by_id
from memgym.data_synth.expert import TrajectoryStep, banks_before_sessions, load_trajectories
from memgym.llm.errors import ConfigError, MemgymError
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.prompts import build_prompt
from memgym.memory_bank.schema import Conversation, Session

class TrainingDataError(MemgymError, ValueError):
    """An expert trajectory that cannot be turned into training examples: names the
    trajectory file, the line, the conversation and the session."""

    kind = "data"

    def __init__(self, file, line: int, conversation_id: str, session: int, reason: str):
        super().__init__(f"{file}: line {line} (conversation {conversation_id}, session {session}): {reason}")
        self.file, self.line, self.conversation_id, self.session = str(file), line, conversation_id, session


class ExampleLengthError(MemgymError, ValueError):
    """Every example of a split is longer than ``max_length`` tokens (names the shortest)."""

    kind = "data"


@dataclass
class SessionState:
    """One expert session in context: the conversation, the session (turns and date), the
    expert's outputs for it (``step``), and a private copy of the expert bank *before* it."""

    conversation: Conversation
    session: Session
    step: TrajectoryStep
    bank_before: MemoryBank
    trajectory_file: str

    @property
    def conversation_id(self) -> str:
        return self.conversation.id


def check_managers(managers: Iterable[str]) -> tuple[str, ...]:
    """The selection as a tuple, in order. Raises ConfigError (a ValueError) when empty,
    repeated or unknown."""
    ms = tuple(managers)
    if not ms:
        raise ConfigError(f"--managers is empty; choose from {MANAGERS}")
    bad = [m for m in ms if m not in MANAGERS]
    if bad:
        raise ConfigError(f"--managers: unknown manager(s) {bad}; choose from {MANAGERS}")
    if len(set(ms)) != len(ms):
        raise ConfigError(f"--managers repeats an entry: {list(ms)}")
    return ms


def expert_session_states(trajectory_paths: Sequence[str | Path], *, dataset: str = "locomo",
                          data_path=None) -> list[SessionState]:
    """Every session of the trajectory files, in order, with its :class:`Session` and the replayed
    expert bank before it. Raises ValueError (no paths, unknown dataset), FileNotFoundError /
    TrajectoryError, TrainingDataError (a missing or repeated session).
    """
    paths = [Path(p) for p in trajectory_paths]
    if not paths:
        raise ValueError("no trajectory files given")
    per_file = [(p, load_trajectories(p)) for p in paths]
    ids = list(dict.fromkeys(s.conversation_id for _, steps in per_file for s in steps))
    convs = conversations_by_id(dataset, ids, data_path) if ids else {}
    out: list[SessionState] = []
    seen: dict[tuple[str, int], str] = {}
    for path, steps in per_file:
        banks = banks_before_sessions(steps)
        for step in steps:
            key = (step.conversation_id, step.session)
            if key in seen:
                raise TrainingDataError(path, step.line, *key, f"duplicate session (also in {seen[key]})")
            seen[key] = str(path)
            conv = convs[step.conversation_id]
            session = next((s for s in conv.sessions if s.index == step.session), None)
            if session is None:
                raise TrainingDataError(path, step.line, *key, f"{dataset} conversation {conv.id} has no session "
                                        f"{step.session} (it has {len(conv.sessions)})")
            out.append(SessionState(conv, session, step, banks[key], str(path)))
    return out


def sft_rows(states: Sequence[SessionState], *, embedder=None, managers: Sequence[str] = MANAGERS,
             progress: bool = False) -> list[dict]:
    """One row per (session, manager): ``prompt``, ``completion`` (one assistant message of the
    expert JSON), ``conversation_id``, ``session``, ``manager``. Raises ValueError for bad managers.
    """
    ms = check_managers(managers)
    rows = []
    for st in tqdm(states, desc="SFT examples", unit="session", disable=not progress):
        for m in ms:
            prompt = build_prompt(m, st.bank_before, st.session, embedder)
            rows.append({
                "prompt": prompt.messages,
                "completion": [{"role": "assistant", "content": st.step.output_text(m)}],
                "conversation_id": st.conversation_id,
                "session": st.session.index,
                "manager": m,
            })
    return rows


def sft_examples(trajectory_paths: Sequence[str | Path], *, dataset: str = "locomo", data_path=None,
                 embedder=None, managers: Sequence[str] = MANAGERS, progress: bool = False):
    """SFT examples as a ``datasets.Dataset`` with columns ``prompt``, ``completion``,
    ``conversation_id``, ``session``, ``manager`` (sessions × managers rows). Raises what
    :func:`expert_session_states` and :func:`check_managers` raise.
    """
    from datasets import Dataset

    check_managers(managers)
    states = expert_session_states(trajectory_paths, dataset=dataset, data_path=data_path)
    return Dataset.from_list(sft_rows(states, embedder=embedder, managers=managers, progress=progress))


def chat_token_ids(tokenizer, messages: list[dict], *, add_generation_prompt: bool = False) -> list[int]:
    """Token ids of ``messages`` rendered with the tokenizer's chat template, tokenized the
    way TRL's ``SFTTrainer`` does (``apply_chat_template(..., tokenize=True)``)."""
    out = tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=add_generation_prompt,
                                        return_dict=True)
    return list(out["input_ids"])


@dataclass(frozen=True)
class LengthReport:
    """What :func:`drop_overlong` kept and dropped; lengths in tokens of the policy's tokenizer."""

    kept: int
    dropped: int
    max_length: int | None
    longest: int
    dropped_keys: tuple[tuple[str, int, str], ...]

    def to_json(self) -> dict:
        return {"kept": self.kept, "dropped": self.dropped, "max_length": self.max_length,
                "longest_tokens": self.longest, "dropped_examples": [list(k) for k in self.dropped_keys]}


def drop_overlong(ds, tokenizer, max_length: int | None):
    """``(kept_dataset, LengthReport)`` without the rows whose rendered prompt + completion exceeds
    ``max_length`` tokens (None keeps all). Raises ValueError for ``max_length`` < 1,
    :class:`ExampleLengthError` when every row would be dropped.
    """
    if max_length is not None and max_length < 1:
        raise ValueError(f"max_length must be >= 1 or None, got {max_length}")
    lengths = [len(chat_token_ids(tokenizer, r["prompt"] + r["completion"])) for r in ds]
    longest = max(lengths, default=0)
    if max_length is None:
        return ds, LengthReport(len(ds), 0, None, longest, ())
    keep = [i for i, n in enumerate(lengths) if n <= max_length]
    if lengths and not keep:
        raise ExampleLengthError(f"every example is longer than max_length={max_length} tokens (shortest {min(lengths)}); "
                         "raise max_length")
    dropped = tuple((ds[i]["conversation_id"], ds[i]["session"], ds[i]["manager"])
                    for i, n in enumerate(lengths) if n > max_length)
    return ds.select(keep), LengthReport(len(keep), len(dropped), max_length, longest, dropped)
