"""Reference memory program: dated units, a dense index, planned search text, cosine top-k
and greedy budget packing.

- Indexing: each unit is rendered ``[YYYY-MM-DD] content`` (its own date, else the session's)
  and embedded with ``toolkit.embed`` once per ``index`` call; vectors are kept in memory.
- Planning: the task LLM rewrites the question into ``Query.search_text`` (a declarative
  search phrase) plus an optional ``time_hint`` ("YYYY", "YYYY-MM" or "YYYY-MM-DD").
- Retrieval: cosine similarity of the search text with every unit (``toolkit.cosine_topk``),
  plus TIME_BONUS for units whose date starts with the time hint; the TOP_K best are packed
  greedily by score while they fit in OUT_CHAR_BUDGET = 16,000 characters (lines joined by
  newlines), then returned in chronological (index) order.

Contract: see memory_bank/contract/contract.py. ``session`` is the dict
{"index": int, "id": str, "date": ISO str or None, "date_text": str}.
"""
import re
from dataclasses import dataclass
from typing import Optional

import numpy as np

OUT_CHAR_BUDGET = 16_000
TOP_K = 40
EMBED_CHARS = 4000  # the embedder reads a line's first 256 word pieces; longer text is never seen
TIME_BONUS = 0.1

EXTRACTION_INSTRUCTION = (
    "Read the conversation session below and extract every fact worth remembering: events, "
    "plans, preferences, opinions, relationships, possessions, numbers and names. Write one "
    "self-contained memory unit per fact: name the person instead of using pronouns and turn "
    "relative dates (yesterday, last week) into absolute dates using the session date. Answer "
    'with a JSON list of objects with the fields "content" (the fact) and "date" (the '
    "YYYY-MM-DD date the fact happened or was said, or null)."
)

PLANNING_INSTRUCTION = (
    "Rewrite the question into a search query for a memory of dated facts. Answer with one "
    'JSON object with the fields "search_text" (a short declarative phrase with the key '
    'entities and topic, e.g. "Caroline went to a LGBTQ support group") and "time_hint" '
    '(the period the question is about as "YYYY", "YYYY-MM" or "YYYY-MM-DD", or null).'
)

ANSWER_INSTRUCTION = (
    "Answer the question from the dated memory facts below. Facts are in chronological order "
    "and prefixed with their date; resolve relative time expressions against these dates. "
    "Give a short, direct answer. If the facts do not contain the answer, say "
    '"No information available."'
)

_ISO_DATE = re.compile(r"^\d{4}(-\d{2}(-\d{2})?)?")


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
    """A planned query: the search phrase and an optional period prefix (YYYY[-MM[-DD]])."""

    search_text: str
    time_hint: Optional[str] = None


def normalise_date(text):
    """The leading ISO date prefix (YYYY, YYYY-MM or YYYY-MM-DD) of ``text``, or None."""
    if not text:
        return None
    match = _ISO_DATE.match(text.strip())
    return match.group(0) if match else None


def pack_lines(ranked, lines, budget):
    """Indices chosen greedily from ``ranked`` (best first) whose lines, joined by newlines,
    fit in ``budget`` characters; a line that does not fit is skipped."""
    chosen, used = [], 0
    for i in ranked:
        cost = len(lines[i]) + (1 if chosen else 0)
        if used + cost <= budget:
            chosen.append(i)
            used += cost
    return chosen


class Memory:
    """Dated unit lines with one embedding row each."""

    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.lines = []
        self.dates = []
        self.blocks = []
        self.matrix = None

    def index(self, units, session):
        if not units:
            return
        session_date = normalise_date(session.get("date"))
        new_lines = []
        for unit in units:
            date = normalise_date(unit.date) or session_date
            self.dates.append(date)
            new_lines.append(f"[{date}] {unit.content}" if date else unit.content)
        self.blocks.append(np.asarray(self.toolkit.embed([line[:EMBED_CHARS] for line in new_lines]),
                                      dtype=np.float32))
        self.lines.extend(new_lines)
        self.matrix = None

    def _matrix(self):
        if self.matrix is None:
            self.matrix = np.vstack(self.blocks)
            self.blocks = [self.matrix]
        return self.matrix

    def retrieve(self, query):
        if not self.lines:
            return ""
        query_vec = self.toolkit.embed([query.search_text or ""])[0]
        hits = self.toolkit.cosine_topk(query_vec, self._matrix(), len(self.lines))
        hint = normalise_date(query.time_hint)
        scored = []
        for i, score in hits:
            if hint and self.dates[i] and self.dates[i].startswith(hint):
                score += TIME_BONUS
            scored.append((-score, i))
        scored.sort()
        ranked = [i for _, i in scored[:TOP_K]]
        chosen = pack_lines(ranked, self.lines, OUT_CHAR_BUDGET)
        if not chosen and ranked:  # even the best line alone is too long: truncate it
            return self.lines[ranked[0]][:OUT_CHAR_BUDGET]
        return "\n".join(self.lines[i] for i in sorted(chosen))
