"""Static baseline: dense top-k over the rendered units (with `turns` extraction, over the turns).

Indexing embeds each rendered line ``[date] content`` with ``toolkit.embed`` (the run's
embedder: all-MiniLM-L6-v2 by default), once per ``index`` call. Retrieval embeds the
question, ranks every line by cosine similarity (``toolkit.cosine_topk``; ties: the earlier
line), packs the TOP_K best greedily into OUT_CHAR_BUDGET and returns them best first. This is
the usual dense-retrieval baseline (e.g. the "RAG top-k" rows of LoCoMo / LongMemEval tables)
with no planning, time hints or reranking.

Contract: memory_bank/contract/contract.py. The planned Query carries the question text.
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

OUT_CHAR_BUDGET = 16_000
TOP_K = 10
EMBED_CHARS = 4000  # the embedder reads a line's first 256 word pieces; longer text is never seen

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
    """The planned query: the text to search for."""

    question: str


def render_unit(unit, session_date):
    """``[date] content`` (the unit's own date, else its session's date, else no prefix)."""
    date = unit.date or session_date
    return f"[{date}] {unit.content}" if date else unit.content


def pack_lines(ranked, lines, budget):
    """Indices taken greedily from ``ranked`` (best first) whose lines, joined by newlines,
    fit in ``budget`` characters; a line that does not fit is skipped."""
    chosen, used = [], 0
    for i in ranked:
        cost = len(lines[i]) + (1 if chosen else 0)
        if used + cost <= budget:
            chosen.append(i)
            used += cost
    return chosen


class Memory:
    """Rendered lines with one embedding row each."""

    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.lines = []
        self.blocks = []
        self.matrix = None

    def index(self, units, session):
        session_date = (session.get("date") or "")[:10] or session.get("date_text") or None
        new_lines = [render_unit(unit, session_date) for unit in units]
        if not new_lines:
            return
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
        query_vec = self.toolkit.embed([query.question or ""])[0]
        ranked = [i for i, _ in self.toolkit.cosine_topk(query_vec, self._matrix(), TOP_K)]
        chosen = pack_lines(ranked, self.lines, OUT_CHAR_BUDGET)
        if not chosen and ranked:  # even the best line alone is too long: truncate it
            return self.lines[ranked[0]][:OUT_CHAR_BUDGET]
        return "\n".join(self.lines[i] for i in chosen)
