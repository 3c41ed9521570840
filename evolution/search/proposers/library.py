'''The library of component variants the offline ``params`` proposer applies.

Source: docs/design.md § "Capability-driven evolution" (proposers): ranking, hybrid lexical+dense
scoring, MMR diversity, time-hint bonus, date prefixes, chunking long units, deduplication,
answer-instruction variants. Each variant is a list of :class:`Block` s in the same
SEARCH/REPLACE form the coder writes; a block may carry alternative forms (the first whose
SEARCH occurs exactly once in the program is used), so a variant applies to the seed program
(``memory_bank/programs/seed.py``) and to programs derived from it. ``dense_ranking`` turns
the seed's append-only Memory into a ranked one; the retrieval variants then patch the ranked
``retrieve`` at stable anchor lines (``scores = self._matrix() @ query_vec``,
``ranked = order[:TOP_K]``), and the module-level helpers go in front of ``def pack_lines(``.
Every variant passes the four validation levels on the programs it applies to
(tests/test_evolve_proposers.py checks this).
'''
from __future__ import annotations

from dataclasses import dataclass, field

from memgym.evolution.search.edits import Edit, EditError, apply_edits
from memgym.memory_bank.programs import PROGRAMS_DIR


@dataclass(frozen=True)
class Block:
    """One edit with alternative forms: ``forms`` are (search, replace) pairs tried in order."""

    forms: tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Variant:
    """A named component variant. ``kind``: the DESIGN kind (ranking, hybrid, mmr, time_hint,
    date_prefix, chunking, dedup, answer); ``component``: the program component it changes;
    ``capabilities``: the capabilities it is meant to help ("*" = all); ``requires``: text
    that must already be in the program (a variant building on another); ``excludes``: text
    whose presence means the variant is already applied (applying it again would define its
    helpers twice, a program the component merge cannot split); ``budget``: the variant
    changes which of the retrieved lines survive a context budget's cut (their order), so the
    proposer weighs it by the measured share of evidence the cut loses
    (:mod:`memgym.evolution.search.budget_cut`) rather than by ``capabilities`` alone."""

    name: str
    kind: str
    component: str
    capabilities: str
    description: str
    blocks: tuple[Block, ...]
    requires: tuple[str, ...] = field(default=())
    excludes: tuple[str, ...] = field(default=())
    budget: bool = False

    def edits_for(self, source: str) -> list[Edit]:
        """The concrete edits for ``source``: per block, the first form whose SEARCH occurs
        exactly once (earlier blocks applied); a form whose REPLACE equals its SEARCH means
        "already present" and yields no edit. Raises :class:`EditError` when a requirement is
        missing or no form of a block fits."""
        for need in self.requires:
            if need not in source:
                raise EditError(f"variant {self.name} needs {need.strip()!r} in the program")
        for mark in self.excludes:
            if mark in source:
                raise EditError(f"variant {self.name} is already applied ({mark.strip()!r} is in the program)")
        text, out = source, []
        for k, block in enumerate(self.blocks, 1):
            form = next(((s, r) for s, r in block.forms if text.count(s) == 1), None)
            if form is None:
                raise EditError(f"variant {self.name}: no form of block {k} matches the program", block=k)
            if form[0] == form[1]:  # "already there": nothing to change
                continue
            edit = Edit(*form)
            text = apply_edits(text, [edit])
            out.append(edit)
        return out

    def apply(self, source: str) -> tuple[str, list[Edit]]:
        """(new source, edits) for ``source``; :class:`EditError` when it does not apply."""
        edits = self.edits_for(source)
        return apply_edits(source, edits), edits


HELPERS_ANCHOR = "def pack_lines("
SCORES_ANCHOR = "        scores = self._matrix() @ query_vec\n"
RANKED_ANCHOR = "        ranked = order[:TOP_K]\n"
RETURN_ANCHOR = '        return "\\n".join(self.lines[i] for i in sorted(chosen))\n'


def _program_text(name: str, start: str, end: str | None = None) -> str:
    """The text of the shipped program ``name`` (``memory_bank/programs``) from the first line
    ``start`` up to the next ``end`` (to the end of the file when None)."""
    text = (PROGRAMS_DIR / name).read_text(encoding="utf-8")
    text = text[text.index(start):]
    return text[:text.index(end)] if end else text


_SEED_MEMORY = _program_text("seed.py", "class Memory:")

_DENSE_INDEXING = _program_text("dense_topk.py", "    def __init__(self, toolkit):", "    def retrieve(self, query):")

_DENSE_MEMORY = ('''class Memory:
    """Rendered unit lines with one embedding row each, ranked by cosine similarity to the
    query; the TOP_K best are packed into the budget and returned in index order."""

''' + _DENSE_INDEXING + '''    def retrieve(self, query):
        if not self.lines:
            return ""
        text = query_text(query)
        query_vec = np.asarray(self.toolkit.embed([text])[0], dtype=np.float32)
        scores = self._matrix() @ query_vec
        order = [int(i) for i in np.argsort(-scores, kind="stable")]
        ranked = order[:TOP_K]
        chosen = pack_lines(ranked, self.lines, OUT_CHAR_BUDGET)
        if not chosen:
            return self.lines[ranked[0]][:OUT_CHAR_BUDGET]
        return "\\n".join(self.lines[i] for i in sorted(chosen))
''')

_DENSE_HELPERS = '''TOP_K = 40
EMBED_CHARS = 4000  # the embedder reads a line's first 256 word pieces; longer text is never seen


def query_text(query):
    """Every text the planned query carries (its str fields and list[str] items), joined."""
    parts = []
    for f in fields(query):
        value = getattr(query, f.name)
        if isinstance(value, str):
            parts.append(value)
        elif isinstance(value, list):
            parts.extend(v for v in value if isinstance(v, str))
    return " ".join(p for p in parts if p)


''' + _program_text("dense_topk.py", "def pack_lines(", "class Memory:")

_STOPWORDS = ("a an and are as at be by did do does for from had has have he her him his how i in is it its me "
              "my of on or our she so than that the their them they this to was we were what when where which who "
              "why will with would you your")

_LEXICAL = f'''LEXICAL_WEIGHT = 0.3
STOPWORDS = frozenset("{_STOPWORDS}".split())


def word_tokens(text):
    """Lower-cased word tokens of ``text`` without stopwords and one-letter words."""
    return [w for w in re.findall(r"[a-z0-9]+", text.lower()) if len(w) > 1 and w not in STOPWORDS]


def lexical_overlap(text, line_tokens):
    """Per line, the share of the query's distinct tokens it contains (0..1)."""
    want = set(word_tokens(text))
    if not want:
        return np.zeros(len(line_tokens), dtype=np.float32)
    return np.asarray([len(want & toks) / len(want) for toks in line_tokens], dtype=np.float32)


'''

_MMR = '''MMR_LAMBDA = 0.7
MMR_POOL = 200


def mmr_select(pool, scores, matrix, k, weight):
    """Maximal marginal relevance over ``pool`` (indices, best first): repeatedly take the line
    maximising weight * score - (1 - weight) * (max cosine to the lines already taken)."""
    pool = list(pool)
    taken = []
    best_sim = np.full(len(pool), -1.0, dtype=np.float32)
    vecs = matrix[pool] if pool else None
    while pool and len(taken) < k:
        values = [weight * float(scores[i]) - (1.0 - weight) * max(0.0, float(best_sim[j]))
                  for j, i in enumerate(pool)]
        j = max(range(len(pool)), key=lambda n: (values[n], -n))
        taken.append(pool[j])
        sims = vecs @ vecs[j]
        best_sim = np.maximum(best_sim, sims)
        pool.pop(j)
        best_sim = np.delete(best_sim, j)
        vecs = np.delete(vecs, j, axis=0)
    return taken


'''

_TIME = '''TIME_BONUS = 0.1
MONTHS = ("january", "february", "march", "april", "may", "june", "july", "august", "september", "october",
          "november", "december")


def time_hints(text):
    """Date prefixes ("YYYY" or "YYYY-MM") a question mentions: a month name with a year
    ("May 2023") or a bare year."""
    low = text.lower()
    hints = []
    for month, year in re.findall(r"\\b(" + "|".join(MONTHS) + r")\\w*,?\\s+(\\d{4})\\b", low):
        hints.append(f"{year}-{MONTHS.index(month) + 1:02d}")
    for year in re.findall(r"\\b(19\\d\\d|20\\d\\d)\\b", low):
        if not any(h.startswith(year) for h in hints):
            hints.append(year)
    return hints


def time_match(text, lines):
    """1.0 for lines whose leading "[YYYY-MM-DD" date starts with a hint of ``text``, else 0."""
    hints = time_hints(text)
    out = np.zeros(len(lines), dtype=np.float32)
    if hints:
        for i, line in enumerate(lines):
            if line.startswith("[") and any(line[1:].startswith(h) for h in hints):
                out[i] = 1.0
    return out


'''

_DATE_WORDS = '''MONTH_NAMES = ("January", "February", "March", "April", "May", "June", "July", "August", "September",
               "October", "November", "December")
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def date_words(date):
    """``2023-05-08`` → ``2023-05-08, Monday 8 May 2023``; other text is returned unchanged."""
    match = re.match(r"^(\\d{4})-(\\d{2})-(\\d{2})", date or "")
    if not match:
        return date
    year, month, day = (int(g) for g in match.groups())
    try:
        weekday = WEEKDAYS[datetime.date(year, month, day).weekday()]
    except ValueError:
        return date
    return f"{match.group(0)}, {weekday} {day} {MONTH_NAMES[month - 1]} {year}"


def render_unit('''

_CHUNK = '''CHUNK_CHARS = 300


def chunk_line(line, limit):
    """``line`` split at sentence ends into pieces of at most ~``limit`` characters, each
    keeping the line's leading "[...]" date prefix; short lines come back whole."""
    if len(line) <= limit:
        return [line]
    prefix = ""
    if line.startswith("[") and "] " in line:
        prefix = line[: line.index("] ") + 2]
    body = line[len(prefix):]
    pieces, cur = [], ""
    for sentence in re.split(r"(?<=[.!?])\\s+", body):
        if cur and len(cur) + 1 + len(sentence) > limit:
            pieces.append(cur)
            cur = sentence
        else:
            cur = f"{cur} {sentence}".strip()
    if cur:
        pieces.append(cur)
    return [prefix + p for p in pieces]


'''


def _answer_variant(name: str, caps: str, sentence: str, description: str) -> Variant:
    return Variant(name, "answer", "answer", caps, description,
                   (Block(((f"ANSWER_INSTRUCTION = (\n", f"ANSWER_INSTRUCTION = (\n    {sentence!r}\n"),)),),
                   excludes=(sentence[:60],))


_IMPORT_FORMS = (("from dataclasses import dataclass\n", "from dataclasses import dataclass, fields\n"),)


def _import(module: str) -> Block:
    """Add ``import <module>`` after the program's first import line (once)."""
    return Block(((f"import {module}\n", f"import {module}\n"),
                  ("from dataclasses import dataclass", f"import {module}\nfrom dataclasses import dataclass")))


LIBRARY: tuple[Variant, ...] = (
    Variant("dense_ranking", "ranking", "retrieval", "*",
            "rank units by cosine similarity of their embedding to the query, pack the TOP_K best",
            (Block(_IMPORT_FORMS), Block((("from typing import Optional\n",
                                          "from typing import Optional\n\nimport numpy as np\n"),)),
             Block((("def render_unit(", _DENSE_HELPERS + "def render_unit("),)),
             Block(((_SEED_MEMORY, _DENSE_MEMORY),)))),
    Variant("rank_order", "ranking", "retrieval", "*",
            "return the chosen lines best first, not in index order (a reader cut to a context budget keeps the "
            "best-ranked lines)",
            (Block(((RETURN_ANCHOR, '        return "\\n".join(self.lines[i] for i in chosen)\n'),)),),
            requires=(RETURN_ANCHOR,), budget=True),
    Variant("hybrid_lexical", "hybrid", "retrieval", "FPA",
            "hybrid scoring: add LEXICAL_WEIGHT x the share of query words a line contains to the cosine",
            (_import("re"), Block(((HELPERS_ANCHOR, _LEXICAL + HELPERS_ANCHOR),)),
             Block(((SCORES_ANCHOR, SCORES_ANCHOR +
                     "        if getattr(self, \"line_tokens\", None) is None or len(self.line_tokens) != len(self.lines):\n"
                     "            self.line_tokens = [set(word_tokens(line)) for line in self.lines]\n"
                     "        scores = scores + LEXICAL_WEIGHT * lexical_overlap(text, self.line_tokens)\n"),)),),
            requires=(SCORES_ANCHOR,), excludes=("def lexical_overlap(",)),
    Variant("mmr", "mmr", "retrieval", "M",
            "MMR diversity: pick the TOP_K lines by maximal marginal relevance among the MMR_POOL best",
            (Block(((HELPERS_ANCHOR, _MMR + HELPERS_ANCHOR),)),
             Block(((RANKED_ANCHOR, "        ranked = mmr_select(order[:MMR_POOL], scores, self._matrix(), TOP_K, "
                                    "MMR_LAMBDA)\n"),))),
            requires=(RANKED_ANCHOR,), excludes=("def mmr_select(",)),
    Variant("time_hint", "time_hint", "retrieval", "T",
            "time-hint bonus: TIME_BONUS for lines dated in a month/year the question names",
            (_import("re"), Block(((HELPERS_ANCHOR, _TIME + HELPERS_ANCHOR),)),
             Block(((SCORES_ANCHOR, SCORES_ANCHOR + "        scores = scores + TIME_BONUS * time_match(text, "
                                                    "self.lines)\n"),))),
            requires=(SCORES_ANCHOR,), excludes=("def time_match(",)),
    Variant("date_words", "date_prefix", "indexing", "T",
            "date prefixes in words: [2023-05-08, Monday 8 May 2023] instead of [2023-05-08]",
            (_import("re"), _import("datetime"), Block((("def render_unit(", _DATE_WORDS),)),
             Block((('    return f"[{date}] {unit.content}" if date else unit.content\n',
                     '    return f"[{date_words(date)}] {unit.content}" if date else unit.content\n'),)))),
    Variant("chunking", "chunking", "indexing", "FM",
            "chunk long units: split rendered lines over CHUNK_CHARS at sentence ends, keeping the date prefix",
            (_import("re"), Block(((HELPERS_ANCHOR, _CHUNK + HELPERS_ANCHOR),)),
             Block((("        new_lines = [render_unit(unit, session_date) for unit in units]\n",
                     "        new_lines = [piece for unit in units\n"
                     "                     for piece in chunk_line(render_unit(unit, session_date), CHUNK_CHARS)]\n"),))),
            requires=(HELPERS_ANCHOR,), excludes=("def chunk_line(",)),
    Variant("dedup", "dedup", "indexing", "*",
            "deduplicate: index each distinct rendered line once",
            (Block((("        self.lines = []\n", "        self.lines = []\n        self.seen = set()\n"),)),
             Block((("        if not new_lines:\n            return\n",
                     "        new_lines = [x for x in dict.fromkeys(new_lines) if x not in self.seen]\n"
                     "        self.seen.update(new_lines)\n        if not new_lines:\n            return\n"),
                    ("            self.lines.append(render_unit(unit, session_date))\n",
                     "            line = render_unit(unit, session_date)\n            if line not in self.seen:\n"
                     "                self.seen.add(line)\n                self.lines.append(line)\n")))),
            excludes=("self.seen",)),
    _answer_variant("answer_chronology", "TM", "Memory lines start with their date; order events by these dates "
                    "and resolve relative time expressions against them. ",
                    "answer instruction: use the line dates for time questions"),
    _answer_variant("answer_abstain", "A", "Check that the memory really supports the answer; if it only "
                    "mentions a similar person or event, say that no information is available. ",
                    "answer instruction: abstain on look-alike evidence"),
    _answer_variant("answer_aggregate", "MP", "Collect every memory line relevant to the question before "
                    "answering, and list all items when several apply. ",
                    "answer instruction: aggregate over all relevant lines"),
)
"""The shipped variants, in the order the proposer lists them."""


def variant(name: str) -> Variant:
    """The library variant ``name`` (KeyError listing the names)."""
    for v in LIBRARY:
        if v.name == name:
            return v
    raise KeyError(f"no variant {name!r}; the library has {', '.join(v.name for v in LIBRARY)}")
