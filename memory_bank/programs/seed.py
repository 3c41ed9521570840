"""PrisMem seed memory program: append units in input order, return their concatenation.

Source: PrisMem (arXiv 2610.06361), appendix "seed program": "It appends
extracted units in input order and returns their concatenation, truncated to the context
budget, without query-dependent ranking." OUT_CHAR_BUDGET = 16,000 characters.

Contract: see memory_bank/contract/contract.py. ``session`` is the dict
{"index": int, "id": str, "date": ISO str or None, "date_text": str}.
"""
from dataclasses import dataclass
from typing import Optional

OUT_CHAR_BUDGET = 16_000

EXTRACTION_INSTRUCTION = (
    "Read the conversation session below and write down every fact worth remembering for later "
    "questions: events with their dates, stated preferences, plans, relationships, numbers and "
    "names. Write one memory unit per fact, self-contained (resolve pronouns and relative dates "
    "against the session date). Answer with a JSON list of objects with the fields "
    '"content" (the fact, one or two sentences) and "date" (YYYY-MM-DD of the event when '
    "known, else null)."
)

PLANNING_INSTRUCTION = (
    "Turn the user's question into a memory query. Answer with one JSON object with the field "
    '"question" holding the question to search the memory for.'
)

ANSWER_INSTRUCTION = (
    "Answer the question using only the memory below. Give a short, direct answer. If the "
    'memory does not contain the answer, say "No information available."'
)


@dataclass
class MemoryUnit:
    """One remembered fact. part/entry_id/session carry a trained extractor's bank entries."""

    content: str
    date: Optional[str] = None
    part: Optional[str] = None
    entry_id: Optional[str] = None
    session: Optional[int] = None


@dataclass
class Query:
    """The planned query; the seed ignores it (no query-dependent ranking)."""

    question: str


def render_unit(unit, session_date):
    """``[date] content`` (the unit's own date, else its session's date, else no prefix)."""
    date = unit.date or session_date
    return f"[{date}] {unit.content}" if date else unit.content


class Memory:
    """An append-only list of rendered units."""

    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.lines = []

    def index(self, units, session):
        session_date = (session.get("date") or "")[:10] or session.get("date_text") or None
        for unit in units:
            self.lines.append(render_unit(unit, session_date))

    def retrieve(self, query):
        return "\n".join(self.lines)[:OUT_CHAR_BUDGET]
