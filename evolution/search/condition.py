"""Condition-level merge: one program that keeps two behaviours and picks one per question by its
own reading of the question (PrisMem stage III: integration "reconciles their conditions of use",
arXiv 2610.06361).

- :class:`QuestionReader`: a Bernoulli naive-Bayes reader trained on the train split's questions
  and primary labels: ``bias + sum(weight[w] for each distinct kept word w) > 0``, the kept words
  being the ``max_words`` of highest mutual information with the label (in >= ``min_count``
  questions). :meth:`QuestionReader.render` writes the rule into the program.
- :func:`condition_merge`: the merge's program whole, plus the base's ``Memory`` as
  ``BaseMemory`` and the base's differing module names copied with suffix ``_base`` (renamed on
  the AST); both index every session, ``retrieve`` asks one side per question. The contract
  elements (``MemoryUnit``, ``Query``, the instructions) must be equal in both programs.
"""
from __future__ import annotations

import ast
import math
import re
import textwrap
from dataclasses import dataclass

from memgym.evolution.search.elements import MergeError, split_program

__all__ = ["CONTRACT_KEYS", "QuestionReader", "condition_merge", "question_words"]

CONTRACT_KEYS = ("class MemoryUnit", "class Query", "EXTRACTION_INSTRUCTION", "PLANNING_INSTRUCTION",
                 "ANSWER_INSTRUCTION")
_WORD = re.compile(r"[a-z0-9']+")


def question_words(text: str) -> set[str]:
    """Distinct lower-cased word tokens (letters, digits, apostrophes) of ``text``; the same
    rule as the rendered ``condition_words``."""
    return set(_WORD.findall(text.lower()))


@dataclass(frozen=True)
class QuestionReader:
    """``capabilities``: the letters it detects; ``bias``: the log-odds with no kept word
    present; ``words``: word → log-odds weight when present; ``train_accuracy``: the share of
    train questions it reads right; ``n_train``: their number."""

    capabilities: str
    bias: float
    words: dict
    train_accuracy: float
    n_train: int

    def score(self, text: str) -> float:
        return self.bias + sum(self.words.get(w, 0.0) for w in question_words(text))

    @classmethod
    def train(cls, questions: list[str], labels: list[str | None], capabilities: str, *, max_words: int = 40,
              min_count: int = 2) -> "QuestionReader":
        """Fit on ``questions`` with primary ``labels`` (None = unlabelled, skipped). Raises
        :class:`MergeError` when no question, or no question of ``capabilities`` or of the
        others, is labelled (nothing to learn)."""
        rows = [(question_words(q), lab in capabilities) for q, lab in zip(questions, labels) if lab]
        pos = sum(1 for _, y in rows if y)
        neg = len(rows) - pos
        if not pos or not neg:
            raise MergeError(f"condition reader for {capabilities}: the train split has {pos} questions of "
                             f"{capabilities} and {neg} of the others; both must be > 0")
        df_pos: dict[str, int] = {}
        df_neg: dict[str, int] = {}
        for words, y in rows:
            for w in words:
                (df_pos if y else df_neg)[w] = (df_pos if y else df_neg).get(w, 0) + 1
        n = len(rows)

        def mi(w: str) -> float:
            out = 0.0
            a, b = df_pos.get(w, 0), df_neg.get(w, 0)
            for cnt, py, pw in ((a, pos, a + b), (pos - a, pos, n - a - b), (b, neg, a + b), (neg - b, neg, n - a - b)):
                if cnt:
                    out += cnt / n * math.log(cnt * n / (py * pw))
            return out

        vocab = [w for w in set(df_pos) | set(df_neg) if df_pos.get(w, 0) + df_neg.get(w, 0) >= min_count]
        keep = sorted(vocab, key=lambda w: (-mi(w), w))[:max_words]
        bias = math.log(pos / neg)
        words = {}
        for w in keep:
            ps, pn = (df_pos.get(w, 0) + 1) / (pos + 2), (df_neg.get(w, 0) + 1) / (neg + 2)
            bias += math.log((1 - ps) / (1 - pn))
            words[w] = round(math.log(ps / pn) - math.log((1 - ps) / (1 - pn)), 4)
        bias = round(bias, 4)
        reader = cls(capabilities, bias, dict(sorted(words.items())), 0.0, n)
        right = sum(1 for words_, y in rows if (bias + sum(words.get(w, 0.0) for w in words_) > 0) == y)
        return cls(capabilities, bias, reader.words, right / n, n)

    def render(self) -> str:
        """Program source of the rule (constants and ``reads_as_condition``)."""
        items = ", ".join(f"{w!r}: {v!r}" for w, v in self.words.items())
        return (f"# condition-level merge: a naive-Bayes reading of the question, fit on {self.n_train} train "
                f"questions\n# (reads as {self.capabilities}: {self.train_accuracy:.3f} right on train)\n"
                f"CONDITION_BIAS = {self.bias!r}\nCONDITION_WORDS = {{{items}}}\n\n\n"
                "def condition_words(text):\n"
                '    """Distinct lower-cased word tokens of ``text``."""\n'
                "    return set(re.findall(r\"[a-z0-9']+\", text.lower()))\n\n\n"
                "def reads_as_condition(text):\n"
                f'    """True when the question reads as {self.capabilities} (naive-Bayes log-odds > 0)."""\n'
                "    return CONDITION_BIAS + sum(CONDITION_WORDS.get(w, 0.0) for w in condition_words(text)) > 0\n\n\n"
                "def condition_text(query):\n"
                '    """Every str field (and list[str] item) of the planned query, joined."""\n'
                "    parts = []\n"
                "    for value in vars(query).values():\n"
                "        if isinstance(value, str):\n"
                "            parts.append(value)\n"
                "        elif isinstance(value, list):\n"
                "            parts.extend(v for v in value if isinstance(v, str))\n"
                '    return " ".join(parts)\n')


class _Rename(ast.NodeTransformer):
    """Rename Name nodes (and the names top-level defs/classes define) by ``names``; inside a
    function, a parameter that shadows a renamed name keeps it unrenamed in that body."""

    def __init__(self, names: dict[str, str]):
        self.names = names

    def visit_Name(self, node: ast.Name) -> ast.AST:
        node.id = self.names.get(node.id, node.id)
        return node

    def visit_FunctionDef(self, node):
        node.decorator_list = [self.visit(d) for d in node.decorator_list]
        a = node.args
        for d in a.defaults + [x for x in a.kw_defaults if x is not None]:
            self.visit(d)
        params = {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} | \
            {x.arg for x in (a.vararg, a.kwarg) if x is not None}
        inner = _Rename({k: v for k, v in self.names.items() if k not in params})
        node.body = [inner.visit(st) for st in node.body]
        return node

    visit_AsyncFunctionDef = visit_FunctionDef


def _renamed(text: str, names: dict[str, str]) -> str:
    """``text`` (top-level statements, dedented) with every name in ``names`` renamed: the names
    it defines (def, class, assignment targets) and the names it uses (module doc)."""
    tree = ast.parse(textwrap.dedent(text))
    for st in tree.body:
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            st.name = names.get(st.name, st.name)
    tree = _Rename(names).visit(tree)
    return ast.unparse(tree) + "\n"


def _defined(key: str) -> list[str]:
    return key.removeprefix("Memory.").removeprefix("def ").removeprefix("class ").split(",")


def _loads(text: str) -> set[str]:
    try:
        tree = ast.parse(textwrap.dedent(text))
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}


_MEMORY_LINE = re.compile(r"(?m)^class Memory(?=[\s:(])")
_RESERVED = ("BaseMemory", "MergedMemory", "reads_as_condition", "condition_text", "condition_words",
             "CONDITION_WORDS", "CONDITION_BIAS")


def condition_merge(base_source: str, merged_source: str, reader: QuestionReader, on_match: str, *,
                    base_id: str = "base", merged_id: str = "merge") -> str:
    """The condition-level program (module doc). ``on_match``: ``"base"`` (questions that read
    as ``reader.capabilities`` get the base's retrieval, the rest the merge's) or ``"merged"``.
    Raises :class:`MergeError` when a program cannot be split, the contract elements differ, or a
    name it needs (``BaseMemory``, ``<name>_base``, ``reads_as_condition``, ...) is taken."""
    if on_match not in ("base", "merged"):
        raise MergeError(f"condition merge: on_match must be base or merged, got {on_match!r}")
    bp, mp = split_program(base_source, base_id), split_program(merged_source, merged_id)
    bm, mm = bp.element_map(), mp.element_map()
    for k in CONTRACT_KEYS:
        if (bm[k].norm if k in bm else None) != (mm[k].norm if k in mm else None):
            raise MergeError(f"condition merge: {k} differs between {base_id} and {merged_id}; both sides share "
                             "extraction, planning and the answer instruction, so it must be equal")
    taken = {n for k in list(mm) + list(bm) for n in _defined(k)}
    for name in _RESERVED:
        if name in taken:
            raise MergeError(f"condition merge: {name} is already defined in {base_id} or {merged_id}")
    module_b = [e for e in bp.module if e.key != "class Memory" and e.key not in CONTRACT_KEYS]
    named = [e for e in module_b if all(n.isidentifier() for n in _defined(e.key))]
    copy = {e.key for e in named if e.key not in mm or mm[e.key].norm != e.norm}
    while True:  # an identical element that uses a copied name is copied as well
        renamed = {n for k in copy for n in _defined(k)}
        more = {e.key for e in named if e.key not in copy and _loads(e.text) & renamed}
        if not more:
            break
        copy |= more
    rename = {n: n + "_base" for k in copy for n in _defined(k)}
    clash = sorted(v for v in rename.values() if v in taken)
    if clash:
        raise MergeError(f"condition merge: {', '.join(clash)} already defined in {base_id} or {merged_id}")
    head, n_sub = _MEMORY_LINE.subn("class MergedMemory", merged_source, count=1)
    if not n_sub:
        raise MergeError(f"condition merge: {merged_id} has no top-level 'class Memory' line")
    extra = []
    for e in module_b:
        if e.key in copy:
            extra.append(_renamed(e.text, rename))
        elif e.key not in mm and e.key not in named:  # an import (or other statement) the merge lacks
            extra.append(e.text.strip("\n") + "\n")
    base_mem = "".join([bm["class Memory"].text] + [bm[e.key].text for e in bp.memory])
    extra.append(_renamed(base_mem, {**rename, "Memory": "BaseMemory"}))
    first, second = ("self.base", "self.merged") if on_match == "base" else ("self.merged", "self.base")
    extra.append(reader.render())
    extra.append(
        "class Memory:\n"
        f'    """Condition-level merge: the base {base_id}\'s memory (BaseMemory) and the merge {merged_id}\'s\n'
        f"    (MergedMemory) both index every session; a question that reads as {reader.capabilities} is answered\n"
        f'    by the {on_match} side, any other by the other side."""\n\n'
        "    def __init__(self, toolkit):\n"
        "        self.toolkit = toolkit\n"
        "        self.base = BaseMemory(toolkit)\n"
        "        self.merged = MergedMemory(toolkit)\n\n"
        "    def index(self, units, session):\n"
        "        self.base.index(units, session)\n"
        "        self.merged.index(units, session)\n\n"
        "    def retrieve(self, query):\n"
        "        if reads_as_condition(condition_text(query)):\n"
        f"            return {first}.retrieve(query)\n"
        f"        return {second}.retrieve(query)\n")
    src = head.rstrip("\n") + "\n\n\n" + "\n\n".join(x.rstrip("\n") + "\n" for x in extra)
    if not re.search(r"(?m)^import re$", src):
        src = _after_docstring(src, "import re\n")
    return src


def _after_docstring(src: str, line: str) -> str:
    """``line`` inserted after the module docstring (at the front when there is none)."""
    body = ast.parse(src).body
    if not (body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant)
            and isinstance(body[0].value.value, str)):
        return line + src
    lines = src.splitlines(keepends=True)
    return "".join(lines[:body[0].end_lineno]) + line + "".join(lines[body[0].end_lineno:])


CONDITION_RULES = ("none", "specialist", "dropped")
"""Recipe ``integrate_condition``: ``none`` (no condition-level retry), ``specialist`` (the
failed merge's behaviour for the questions that read as its contributors' capabilities, less
those that dropped beyond δ; the base's for the rest) and ``dropped`` (the base's behaviour for
the questions that read as the capabilities that dropped beyond δ; the merge's for the rest)."""


def condition_plan(rule: str, contributor_caps: str, dropped: list[str]) -> tuple[str, str] | None:
    """(capabilities the reader detects, side of a match: ``base`` | ``merged``) for ``rule``
    given the failed merge's contributors' capabilities and the capabilities that dropped
    beyond δ (both letters in F, T, P, M, A order), or None when the rule leaves nothing to
    condition on (no capability left, or every one)."""
    if rule == "specialist":
        caps = "".join(c for c in "FTPMA" if c in contributor_caps and c not in dropped)
        return (caps, "merged") if caps and len(caps) < 5 else None
    if rule == "dropped":
        caps = "".join(c for c in "FTPMA" if c in dropped)
        return (caps, "base") if caps and len(caps) < 5 else None
    if rule == "none":
        return None
    raise MergeError(f"integrate_condition must be one of {', '.join(CONDITION_RULES)}, got {rule!r}")
