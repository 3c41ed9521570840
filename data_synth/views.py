"""Derived views of a loaded :class:`Conversation` (no I/O)."""
from __future__ import annotations

from dataclasses import replace

from memory_bank.schema import Conversation


def restrict(conv: Conversation, n_sessions: int) -> Conversation:
    """The first ``n_sessions`` sessions and the questions whose evidence (non-empty) lies wholly in
        them, ids and order kept. ValueError unless ``n_sessions`` is an int >= 1.
        """
    if isinstance(n_sessions, bool) or not isinstance(n_sessions, int) or n_sessions < 1:
        raise ValueError(f"n_sessions must be an int >= 1, got {n_sessions!r}")
    sessions = conv.sessions[:n_sessions]
    kept_turns = {t.id for s in sessions for t in s.turns}
    questions = tuple(q for q in conv.questions
                      if q.evidence and all(e in kept_turns for e in q.evidence))
    return replace(conv, sessions=sessions, questions=questions)
