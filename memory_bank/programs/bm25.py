"""Static baseline: BM25 over the rendered units (with `turns` extraction, over the turns).

Source: Robertson & Zaragoza 2009, "The Probabilistic Relevance Framework: BM25 and Beyond"
(Eq. 3.15 term weight), with the non-negative idf of Lucene's BM25Similarity:

    score(q, d) = sum over distinct query terms t present in d of
                  idf(t) * tf(t, d) * (K1 + 1) / (tf(t, d) + K1 * (1 - B + B * |d| / avgdl))
    idf(t) = ln(1 + (N - n(t) + 0.5) / (n(t) + 0.5))

N = number of lines, n(t) = lines containing t, |d| = tokens of line d, avgdl = mean |d|.
Tokens: lower-cased ``[a-z0-9]+`` runs of the rendered line ``[date] content`` (no stemming,
no stopword list). K1 = 1.2, B = 0.75 (the usual defaults). Retrieval takes the TOP_K lines with
a positive score (ties: the earlier line), packs them greedily into OUT_CHAR_BUDGET, and returns
them best first (so a reader cut to a context budget keeps the best-ranked lines).

Contract: memory_bank/contract/contract.py; a program like any evolved one (four validation
levels, the sandbox's import list). The planned Query carries the question text.
"""
import math
import re
from collections import Counter
from dataclasses import dataclass
from typing import Optional

OUT_CHAR_BUDGET = 16_000
TOP_K = 10
K1 = 1.2
B = 0.75

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
    """Rendered lines with an inverted index (term -> [(line, tf)]) and line lengths."""

    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.lines = []
        self.lengths = []
        self.postings = {}

    def index(self, units, session):
        session_date = (session.get("date") or "")[:10] or session.get("date_text") or None
        for unit in units:
            line = render_unit(unit, session_date)
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

    def retrieve(self, query):
        scores = self.bm25(query.question or "")
        ranked = sorted(scores, key=lambda d: (-scores[d], d))[:TOP_K]
        chosen = pack_lines(ranked, self.lines, OUT_CHAR_BUDGET)
        if not chosen and ranked:  # even the best line alone is too long: truncate it
            return self.lines[ranked[0]][:OUT_CHAR_BUDGET]
        return "\n".join(self.lines[i] for i in chosen)
