"""A fake OpenAI-compatible coder that answers like a competent coder (test fixture).

:func:`competent_reply` reads the parent program out of the request (the numbered ``# Parent
program`` block) and answers with the first of :data:`EDITS` that applies to it and is not in it
yet: hybrid BM25 + dense ranking that fills the context budget instead of a fixed top-k,
written-out date prefixes ("[8 May 2023]", the form answers use; its first answer mis-copies a
docstring line, so a repair turn follows, and its month name comes from ``strftime``, which
imports ``time`` inside the sandbox, so the validation revise turn replaces it by a month
table), and each hit's preceding turn (the question a reply answers). An edit already named in
the request (lineage, earlier attempts) is not proposed again. When nothing applies it answers
in prose (the proposal fails). :func:`serve_coder` serves it over :func:`memgym.llm.server.serve_backend`.
"""
from __future__ import annotations

import re

from memgym.llm.server import serve_backend
from tests.helpers import ScriptedBackend

IMPORTS_SEED = "from dataclasses import dataclass\nfrom typing import Optional\n"
IMPORTS_HYBRID = ("import math\nimport re\nfrom collections import Counter\nfrom dataclasses import dataclass\n"
                  "from typing import Optional\n\nimport numpy as np\n")

MEMORY_SEED = '''class Memory:
    """An append-only list of rendered units."""

    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.lines = []

    def index(self, units, session):
        session_date = (session.get("date") or "")[:10] or session.get("date_text") or None
        for unit in units:
            self.lines.append(render_unit(unit, session_date))

    def retrieve(self, query):
        return "\\n".join(self.lines)[:OUT_CHAR_BUDGET]
'''

MEMORY_HYBRID = '''CONTEXT_CHARS = 3400  # what survives the 1,024-token cut; lines past it are never read
RRF_K = 60


def word_tokens(text):
    return re.findall(r"[a-z0-9]+", text.lower())


class Memory:
    """Hybrid retrieval: BM25 and dense cosine rankings fused by reciprocal rank, best lines
    packed up to the context budget."""

    def __init__(self, toolkit):
        self.toolkit = toolkit
        self.lines = []
        self.lengths = []
        self.postings = {}
        self.rows = []

    def index(self, units, session):
        session_date = (session.get("date") or "")[:10] or session.get("date_text") or None
        new = [render_unit(unit, session_date) for unit in units]
        if not new:
            return
        self.rows.extend(self.toolkit.embed([line[:2000] for line in new]))
        for line in new:
            toks = word_tokens(line)
            doc = len(self.lines)
            self.lines.append(line)
            self.lengths.append(len(toks))
            for term, tf in Counter(toks).items():
                self.postings.setdefault(term, []).append((doc, tf))

    def bm25(self, text):
        n = len(self.lines)
        avg = sum(self.lengths) / n
        scores = {}
        for term in set(word_tokens(text)):
            posting = self.postings.get(term, [])
            if not posting:
                continue
            idf = math.log(1.0 + (n - len(posting) + 0.5) / (len(posting) + 0.5))
            for doc, tf in posting:
                norm = 1.2 * (0.25 + 0.75 * self.lengths[doc] / avg)
                scores[doc] = scores.get(doc, 0.0) + idf * tf * 2.2 / (tf + norm)
        return scores

    def ranked(self, text):
        lexical = sorted(self.bm25(text).items(), key=lambda kv: (-kv[1], kv[0]))
        qv = self.toolkit.embed([text])[0]
        dense = self.toolkit.cosine_topk(qv, np.asarray(self.rows, dtype=np.float32), len(self.lines))
        fused = {}
        for ranking in ([d for d, _ in lexical], [i for i, _ in dense]):
            for rank, doc in enumerate(ranking, 1):
                fused[doc] = fused.get(doc, 0.0) + 1.0 / (RRF_K + rank)
        return sorted(fused, key=lambda d: (-fused[d], d))

    def retrieve(self, query):
        if not self.lines:
            return ""
        out, used = [], 0
        for i in self.ranked(query.question or ""):
            if used + len(self.lines[i]) + 1 > CONTEXT_CHARS:
                continue
            out.append(self.lines[i])
            used += len(self.lines[i]) + 1
        return "\\n".join(out)[:OUT_CHAR_BUDGET]
'''

RENDER_SEED = '''def render_unit(unit, session_date):
    """``[date] content`` (the unit's own date, else its session's date, else no prefix)."""
    date = unit.date or session_date
    return f"[{date}] {unit.content}" if date else unit.content
'''
RENDER_MISCOPIED = RENDER_SEED.replace("(the unit's own date, else its session's date, else no prefix)",
                                       "(the unit's date, else the session's)")
RENDER_STRFTIME = '''def render_unit(unit, session_date):
    """``[8 May 2023] content``: the unit's own date, else its session's, written out as the
    questions and reference answers write dates (answer-recall matches words, not ISO digits)."""
    date = unit.date or session_date
    if not date:
        return unit.content
    try:
        d = datetime.date.fromisoformat(date[:10])
        date = f"{d.day} {d.strftime('%B')} {d.year}"
    except ValueError:
        pass
    return f"[{date}] {unit.content}"
'''
RENDER_WORDS = RENDER_STRFTIME.replace("{d.strftime('%B')}", "{MONTHS[d.month - 1]}")
MONTHS_LINE = ('MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September",\n'
               '          "October", "November", "December")\n')

PACK_HITS = '''        out, used = [], 0
        for i in self.ranked(query.question or ""):
            if used + len(self.lines[i]) + 1 > CONTEXT_CHARS:
                continue
            out.append(self.lines[i])
            used += len(self.lines[i]) + 1
        return "\\n".join(out)[:OUT_CHAR_BUDGET]
'''
PACK_WITH_PRECEDING = '''        out, used, taken = [], 0, set()
        for i in self.ranked(query.question or ""):
            for j in (i - 1, i):  # the preceding turn is often the question this line answers
                if j < 0 or j in taken or used + len(self.lines[j]) + 1 > CONTEXT_CHARS:
                    continue
                taken.add(j)
                out.append(self.lines[j])
                used += len(self.lines[j]) + 1
        return "\\n".join(out)[:OUT_CHAR_BUDGET]
'''


def block(search: str, replace: str) -> str:
    return f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"


# (marker that shows the edit is in, [(search, replace)], explanation, mis-copied first answer or None)
EDITS = [
    ("RRF_K = 60", [(IMPORTS_SEED, IMPORTS_HYBRID), (MEMORY_SEED, MEMORY_HYBRID)],
     "Rank lines by hybrid BM25 + dense similarity (RRF) and fill the ~3,400-character context budget best first.",
     None),
    ("import datetime", [("from dataclasses import dataclass\n", "import datetime\nfrom dataclasses import dataclass\n"),
                         (RENDER_SEED, RENDER_STRFTIME)],
     "Write dates out as '8 May 2023' in the line prefix, the form questions and answers use.",
     [("from dataclasses import dataclass\n", "import datetime\nfrom dataclasses import dataclass\n"),
      (RENDER_MISCOPIED, RENDER_STRFTIME)]),
    ("the preceding turn is often", [(PACK_HITS, PACK_WITH_PRECEDING)],
     "Add each hit's preceding turn: a reply's question holds the words the question asks about.", None),
]


def parent_program(messages: list[dict]) -> str:
    """The parent program of a coder request (the numbered block, numbers stripped)."""
    user = next(m["content"] for m in messages if m["role"] == "user")
    m = re.search(r"```python\n(.*?)\n```", user, re.S)
    return "\n".join(re.sub(r"^\s*\d+\| ?", "", line) for line in m.group(1).splitlines()) + "\n" if m else ""


def competent_reply(messages: list[dict], params=None) -> str:
    """The answer to one coder request (module doc)."""
    program = parent_program(messages)
    last = messages[-1]["content"]
    if last.startswith("This program failed validation") and "import of 'time'" in last:
        return (EDITS[1][2] + "\n" + block(RENDER_STRFTIME, MONTHS_LINE + "\n\n" + RENDER_WORDS))
    asked = next(m["content"] for m in messages if m["role"] == "user")  # lineage and earlier attempts
    for marker, blocks, why, miscopied in EDITS:
        if marker in program or why in asked or not all(s in program for s, _ in blocks):
            continue
        if last.startswith("Your edit could not be applied") or miscopied is None:
            return why + "\n" + "".join(block(s, r) for s, r in blocks)
        return why + "\n" + "".join(block(s, r) for s, r in miscopied)
    return "I have no further change to propose for this program."


def serve_coder(model: str = "fake-coder", **kw):
    """(server, spec): the competent coder behind an OpenAI-compatible server on 127.0.0.1
    (``kw``: :func:`memgym.llm.server.serve_backend`'s, e.g. ``server_class=FaultyServer, usage=...``);
    stop with ``server.shutdown(); server.server_close()``."""
    server, _, url = serve_backend(ScriptedBackend(competent_reply, model_id=model), served_model_name=model, **kw)
    return server, f"openai:{url}#{model}"
