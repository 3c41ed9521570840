"""Conversation / QA data model shared by every memgym package; lengths in characters."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from datetime import datetime


class Capability(str, enum.Enum):
    """The five PrisMem capabilities: F factual, T temporal, P preference, M multi-session,
        A adversarial (abstention, contradiction, false premise)."""

    FACTUAL = "F"
    TEMPORAL = "T"
    PREFERENCE = "P"
    MULTI_SESSION = "M"
    ADVERSARIAL = "A"


#: Display names of the capability letters (report tables): the one F/T/P/M/A table.
CAPABILITY_NAMES: dict[str, str] = {"F": "factual", "T": "temporal", "P": "preference", "M": "multi-session",
                                    "A": "adversarial"}


@dataclass(frozen=True)
class Turn:
    """One utterance. ``id`` is LoCoMo's ``dia_id`` ("D3:7") or ``<session_id>:<index>``."""

    id: str
    speaker: str
    text: str
    image_caption: str | None = None

    def render(self) -> str:
        """``[id] speaker: text`` plus ``[shares image: caption]`` for image turns."""
        s = f"[{self.id}] {self.speaker}: {self.text}"
        if self.image_caption:
            s += f" [shares image: {self.image_caption}]"
        return s


@dataclass(frozen=True)
class Session:
    """A dated block of turns. ``index`` is 1-based in conversation order."""

    index: int
    id: str
    date: datetime | None
    date_text: str
    turns: tuple[Turn, ...]

    def transcript(self) -> str:
        return "\n".join(t.render() for t in self.turns)


@dataclass(frozen=True)
class QAItem:
    """A benchmark or synthetic question: ``evidence`` turn ids, ``category`` the native label,
        ``capability`` the primary one, ``rubric`` (BEAM) what a good answer must state."""

    id: str
    question: str
    answer: str
    evidence: tuple[str, ...] = ()
    category: str = ""
    capability: Capability | None = None
    secondary: tuple[Capability, ...] = ()
    question_date: str | None = None
    rubric: tuple[str, ...] = ()


@dataclass(frozen=True)
class Conversation:
    id: str
    speakers: tuple[str, ...]
    sessions: tuple[Session, ...]
    questions: tuple[QAItem, ...] = field(default=())

    @property
    def turn_index(self) -> dict[str, tuple[int, Turn]]:
        """Map turn id -> (session index, turn)."""
        out: dict[str, tuple[int, Turn]] = {}
        for s in self.sessions:
            for t in s.turns:
                out[t.id] = (s.index, t)
        return out

    def n_turns(self) -> int:
        return sum(len(s.turns) for s in self.sessions)

    def evidence_sessions(self, qa: QAItem) -> set[int]:
        """Session indices that hold ``qa``'s evidence turns (unknown ids are skipped)."""
        idx = self.turn_index
        return {idx[e][0] for e in qa.evidence if e in idx}
