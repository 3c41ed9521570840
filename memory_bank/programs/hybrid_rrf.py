"""Static baseline: hybrid BM25 + dense retrieval fused by reciprocal rank (RRF).

Source: Cormack, Clarke & Büttcher 2009, "Reciprocal Rank Fusion outperforms Condorcet and
individual Rank Learning Methods" (SIGIR): RRF(d) = sum over rankings r of 1 / (RRF_K + r(d)),
r(d) the 1-based rank of d in ranking r (a ranking that does not hold d adds nothing),
RRF_K = 60 as in the paper. The two rankings: BM25 over the rendered lines (the lines with a
positive score, exactly as ``bm25.py``: K1 = 1.2, B = 0.75, Lucene's idf) and the dense cosine
ranking of every line (as ``dense_topk.py``). Ties: the earlier line. The TOP_K fused best are
packed greedily into OUT_CHAR_BUDGET and returned best first.

Contract: memory_bank/contract/contract.py. The planned Query carries the question text.
"""
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Optional

import numpy as np

OUT_CHAR_BUDGET = 16_000
TOP_K = 10
EMBED_CHARS = 4000  # the embedder reads a line's first 256 word pieces; longer text is never seen
K1 = 1.2
B = 0.75
RRF_K = 60

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


def word_tokens(text):
    """Lower-cased ``[a-z0-9]+`` runs of ``text``."""
    return re.findall(r"[a-z0-9]+", text.lower())


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
    """Rendered lines with an inverted index (term -> [(line, tf)]), line lengths and one
    embedding row per line."""

    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.lines = []
        self.lengths = []
        self.postings = {}
        self.blocks = []
        self.matrix = None

    def index(self, units, session):
        session_date = (session.get("date") or "")[:10] or session.get("date_text") or None
        new_lines = [render_unit(unit, session_date) for unit in units]
        if new_lines:
            self.blocks.append(np.asarray(self.toolkit.embed([line[:EMBED_CHARS] for line in new_lines]),
                                          dtype=np.float32))
            self.matrix = None
        for line in new_lines:
            tokens = word_tokens(line)
            doc = len(self.lines)
            self.lines.append(line)
            self.lengths.append(len(tokens))
            for term, tf in Counter(tokens).items():
                self.postings.setdefault(term, []).append((doc, tf))

    def bm25(self, text):
        """{line index: BM25 score > 0} of the query ``text`` (module doc)."""
        n_docs = len(self.lines)
        avgdl = (sum(self.lengths) / n_docs) if n_docs else 0.0
        scores = {}
        for term in dict.fromkeys(word_tokens(text)):
            posting = self.postings.get(term)
            if not posting:
                continue
            idf = math.log(1.0 + (n_docs - len(posting) + 0.5) / (len(posting) + 0.5))
            for doc, tf in posting:
                norm = K1 * (1.0 - B + B * self.lengths[doc] / avgdl) if avgdl else K1
                scores[doc] = scores.get(doc, 0.0) + idf * tf * (K1 + 1.0) / (tf + norm)
        return {d: s for d, s in scores.items() if s > 0.0}

    def _matrix(self):
        if self.matrix is None:
            self.matrix = np.vstack(self.blocks)
            self.blocks = [self.matrix]
        return self.matrix

    def retrieve(self, query):
        if not self.lines:
            return ""
        text = query.question or ""
        scores = self.bm25(text)
        lexical = sorted(scores, key=lambda d: (-scores[d], d))
        query_vec = self.toolkit.embed([text])[0]
        dense = [i for i, _ in self.toolkit.cosine_topk(query_vec, self._matrix(), len(self.lines))]
        fused = {}
        for ranking in (lexical, dense):
            for rank, doc in enumerate(ranking, 1):
                fused[doc] = fused.get(doc, 0.0) + 1.0 / (RRF_K + rank)
        ranked = sorted(fused, key=lambda d: (-fused[d], d))[:TOP_K]
        chosen = pack_lines(ranked, self.lines, OUT_CHAR_BUDGET)
        if not chosen and ranked:  # even the best line alone is too long: truncate it
            return self.lines[ranked[0]][:OUT_CHAR_BUDGET]
        return "\n".join(self.lines[i] for i in chosen)
