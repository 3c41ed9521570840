"""Derived views of a loaded :class:`Conversation` (no I/O)."""
from __future__ import annotations

from dataclasses import replace

from memory_bank.schema import Conversation


def restrict(conv: Conversation, n_sessions: int) -> Conversation:
    """Keep the first ``n_sessions`` sessions (in conversation order) and the questions they
    can answer.

    A question is kept iff it has at least one evidence id and every evidence id is a turn
    of a kept session; questions with no (valid) evidence are dropped, since nothing shows
    that the kept prefix answers them. Questions keep their ids and input order.
    ``n_sessions`` larger than the number of sessions keeps them all (the evidence filter
    still applies).

    Raises:
        ValueError: ``n_sessions`` is not an int >= 1.
    """
    if isinstance(n_sessions, bool) or not isinstance(n_sessions, int) or n_sessions < 1:
        raise ValueError(f"n_sessions must be an int >= 1, got {n_sessions!r}")
    sessions = conv.sessions[:n_sessions]
    kept_turns = {t.id for s in sessions for t in s.turns}
    questions = tuple(q for q in conv.questions
                      if q.evidence and all(e in kept_turns for e in q.evidence))
    return replace(conv, sessions=sessions, questions=questions)
