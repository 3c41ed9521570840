"""MemBuilder's four-part memory bank as a memory program: the trained extractor's bank, read by
MemBuilder's retriever.

Source: MemBuilder (arXiv 2601.05488) §3.3 and ``docs/design.md`` § "Retrieval for QA": the answer
model sees the core block plus the top-k (k = 10) entries of episodic ∪ semantic ∪ procedural
by cosine similarity of the question to the entry text. This program reproduces
``memgym.memory_bank.retrieval.BankRetriever`` and ``Retrieved.render`` exactly, so that
``memgym eval`` (which runs this file) scores what the bank holds.

Units: a trained extractor's (or expert replay's) bank entries, one per entry written in a
session (``memgym.memory_bank.contract.session_entries``): ``part`` in core | episodic | semantic |
procedural, ``entry_id``, ``content`` (the entry's text, the whole core block for ``core``) and
``deleted`` (True for an entry removed in that session by DELETE or MERGE). ``index`` applies
them to the four parts in bank order: an existing id is rewritten in place, a new id is
appended, a deleted id is dropped, ``core`` replaces the core block. ``turns`` or
``instruction`` units (no part) go to episodic under a running id.

Retrieval: every live entry's text is embedded in one ``toolkit.embed`` call (in part order
episodic, semantic, procedural, then bank order), the question in another; cosine = inner
product of the L2-normalised float32 vectors (summed in float64); top TOP_K by score (ties: the stable order of
``numpy.argsort`` over ``numpy.argpartition``, as ``memgym.memory_bank.retrieval.VectorIndex``; both
score one question at a time as ``(n, d) @ (d,)`` in float64, so the rankings agree exactly).
Rendered as ``# Core memory`` / core / blank / ``# Retrieved memories`` / ``[id] (part) text``
lines, then cut to CONTEXT_CHARS characters as ``memgym.rewards.scoring.answer.truncate_context``
cuts the answer model's memory (at the last newline in the kept second half).
"""
from dataclasses import dataclass
from typing import Optional

import numpy as np

OUT_CHAR_BUDGET = 16_000
TOP_K = 10
CONTEXT_CHARS = 6000
PARTS = ("episodic", "semantic", "procedural")
EMBED_BATCH = 4096

EXTRACTION_INSTRUCTION = (
    "Read the conversation session below and write down every fact worth remembering for later "
    "questions: events with their dates, stated preferences, plans, relationships, numbers and "
    "names. Write one memory unit per fact, self-contained (resolve pronouns and relative dates "
    'against the session date). Answer with a JSON list of objects with the field "content" '
    "(the fact, one or two sentences)."
)

PLANNING_INSTRUCTION = (
    "Turn the user's question into a memory query. Answer with one JSON object with the field "
    '"question" holding the question to search the memory for.'
)

ANSWER_INSTRUCTION = (
    "You answer questions about a long conversation using only the memory notes you are given. "
    "Reply with a short answer (a few words or one short sentence), with no explanation. "
    "If the memory does not contain the answer, reply exactly: No information available"
)


@dataclass
class MemoryUnit:
    """One bank entry written in a session (see the module docstring)."""

    content: str
    part: Optional[str] = None
    entry_id: Optional[str] = None
    deleted: bool = False


@dataclass
class Query:
    """The text to search for (the question)."""

    question: str


def cut_context(text, limit):
    """The first ``limit`` characters of ``text``; when cut and a newline falls in the second
    half of the kept text, the cut moves back to it (``truncate_context``'s rule)."""
    if len(text) <= limit:
        return text
    head = text[:limit]
    nl = head.rfind("\n")
    if nl >= limit // 2:
        head = head[:nl]
    return head.rstrip()


class Memory:
    """The core block and three ordered parts ``{id: text}``; entry embeddings computed lazily."""

    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.core = ""
        self.parts = {p: {} for p in PARTS}
        self.turn_count = 0
        self.items = None
        self.matrix = None

    def index(self, units, session):
        for unit in units:
            part = unit.part
            if part == "core":
                self.core = "" if unit.deleted else unit.content
                continue
            if part not in self.parts:
                self.turn_count += 1
                part, entry_id = "episodic", unit.entry_id or f"t{self.turn_count}"
            else:
                entry_id = unit.entry_id
            if unit.deleted:
                self.parts[part].pop(entry_id, None)
            else:
                self.parts[part][entry_id] = unit.content
        self.items = None

    def ranked(self, text):
        """``[(part, id, text)]`` of the top TOP_K entries for ``text``, best first."""
        if self.items is None:
            self.items = [(p, i, t) for p in PARTS for i, t in self.parts[p].items()]
            texts = [t for _, _, t in self.items]
            rows = []
            for start in range(0, len(texts), EMBED_BATCH):
                rows += self.toolkit.embed(texts[start: start + EMBED_BATCH])
            self.matrix = np.asarray(rows, dtype=np.float32).reshape(len(texts), -1)
        n = len(self.items)
        if n == 0:
            return []
        q = np.asarray(self.toolkit.embed([text]), dtype=np.float32)[0]
        sims = (self.matrix.astype(np.float64) @ q.astype(np.float64))[None, :]
        k = min(TOP_K, n)
        if k < n:
            part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        else:
            part = np.tile(np.arange(n), (1, 1))
        top = np.take_along_axis(sims, part, axis=1)
        order = np.argsort(-top, axis=1, kind="stable")
        return [self.items[int(i)] for i in np.take_along_axis(part, order, axis=1)[0]]

    def retrieve(self, query):
        lines = []
        if self.core:
            lines += ["# Core memory", self.core, ""]
        hits = self.ranked(query.question or "")
        if hits:
            lines.append("# Retrieved memories")
            lines += [f"[{i}] ({p}) {t}" for p, i, t in hits]
        return cut_context("\n".join(lines).strip(), min(CONTEXT_CHARS, OUT_CHAR_BUDGET))
