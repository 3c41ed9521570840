"""Programs as sets of mergeable elements: the granularity of the offline component merge
(:mod:`memgym.evolution.search.merge`) and of the element key (a program up to statement order).

Source: docs/design.md § "Capability-driven evolution" (trace-guided integration). An element is one
top-level statement (keyed by the names it defines, else its ``ast.unparse`` text, e.g. an
import) or one member of ``class Memory`` (keyed ``Memory.<name>``; ``Memory.retrieve`` is the
retrieval component, every other member indexing). ``norm``: the normalised AST (docstrings
removed), what "changed" compares; ``text``: verbatim, comments above included, so :func:`render`
rebuilds a program from chosen elements.
"""
from __future__ import annotations

import ast
from dataclasses import dataclass

from memgym.evolution.execution.component_diff import NAMED_COMPONENTS, normalised_dump

ABSENT = "<absent>"


class MergeError(ValueError):
    """A program cannot take part in a merge (names the program and why)."""


@dataclass(frozen=True)
class Element:
    """One mergeable piece: ``key`` (see the module doc), ``container`` (``module`` |
    ``Memory``), ``component`` (reporting), ``text`` (verbatim source lines, leading comments
    included) and ``norm`` (normalised AST dump; what "changed" compares)."""

    key: str
    container: str
    component: str
    text: str
    norm: str


def _names(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        out = []
        for t in stmt.targets:
            out += [n.id for n in ast.walk(t) if isinstance(n, ast.Name)]
        return out
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [stmt.name]
    return []


def _start_line(stmt: ast.stmt) -> int:
    decos = getattr(stmt, "decorator_list", None) or []
    return min([stmt.lineno] + [d.lineno for d in decos])


def _segments(lines: list[str], stmts: list[ast.stmt], first_line: int) -> list[str]:
    """Verbatim text of each statement, from the line after the previous one ends (so leading
    comments and blank lines travel with it) to its own last line (1-based ``first_line``)."""
    out, prev_end = [], first_line - 1
    for st in stmts:
        out.append("".join(lines[prev_end: st.end_lineno]))
        prev_end = st.end_lineno
    return out


def _docstring_end(body: list[ast.stmt]) -> int | None:
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        return body[0].end_lineno
    return None


@dataclass
class ProgramParts:
    """A program split into elements: ``docstring`` (the module docstring's lines, "" if
    none), ``module`` (top-level elements in order; ``class Memory`` stands for the class, its
    text being the class header: leading comments, decorators, the ``class`` line and the
    class docstring) and ``memory`` (the members of ``class Memory`` in order)."""

    docstring: str
    module: list[Element]
    memory: list[Element]

    def element_map(self) -> dict[str, Element]:
        return {e.key: e for e in self.module + self.memory}


def split_program(source: str, name: str = "program") -> ProgramParts:
    """Split ``source`` into :class:`ProgramParts`. Raises :class:`MergeError` naming ``name``
    when it does not parse, lacks ``class Memory`` (or its members) or defines a key twice."""
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        raise MergeError(f"{name}: syntax error at line {e.lineno}: {e.msg}") from None
    lines = source.splitlines(keepends=True)
    body = list(tree.body)
    docstring, first = "", 1
    doc_end = _docstring_end(body)
    if doc_end is not None:
        docstring, first, body = "".join(lines[:doc_end]), doc_end + 1, body[1:]
    module, memory, seen, has_memory = [], [], set(), False

    def add(target: list, el: Element) -> None:
        if el.key in seen:
            raise MergeError(f"{name}: {el.key} is defined twice; cannot merge it element by element")
        seen.add(el.key)
        target.append(el)

    prev_end = first - 1
    for st in body:
        text = "".join(lines[prev_end: st.end_lineno])
        start = prev_end
        prev_end = st.end_lineno
        if isinstance(st, ast.ClassDef) and st.name == "Memory":
            has_memory = True
            members = list(st.body)
            head_end = _docstring_end(members)
            if head_end is not None:
                members = members[1:]
            if not members:
                raise MergeError(f"{name}: class Memory has no members besides its docstring")
            if head_end is None:
                head_end = _start_line(members[0]) - 1
            shell = ast.ClassDef(name="Memory", bases=st.bases, keywords=st.keywords, body=[ast.Pass()],
                                 decorator_list=st.decorator_list)
            if hasattr(st, "type_params"):
                shell.type_params = st.type_params
            add(module, Element("class Memory", "module", "indexing", "".join(lines[start:head_end]),
                                normalised_dump(shell)))
            for m, mt in zip(members, _segments(lines, members, head_end + 1)):
                mnames = _names(m)
                key = "Memory." + (",".join(mnames) if mnames else ast.unparse(m))
                add(memory, Element(key, "Memory", "retrieval" if mnames == ["retrieve"] else "indexing", mt,
                                    normalised_dump(m)))
            continue
        names = _names(st)
        if names:
            kinds = {NAMED_COMPONENTS.get(n, "shared") for n in names}
            comp = kinds.pop() if len(kinds) == 1 else "shared"
            prefix = "def " if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef)) else \
                "class " if isinstance(st, ast.ClassDef) else ""
            key = prefix + ",".join(names)
        else:
            comp, key = "shared", ast.unparse(st)
        add(module, Element(key, "module", comp, text, normalised_dump(st)))
    if not has_memory:
        raise MergeError(f"{name}: no class Memory")
    return ProgramParts(docstring, module, memory)


def element_key(source: str) -> str | None:
    """sha256 (16 hex digits) of a program's elements as an unordered set of (key, normalised
    AST): two programs with equal element keys define the same things and differ at most in
    statement order, comments and docstrings. None when the source cannot be split."""
    import hashlib
    import json

    try:
        parts = split_program(source)
    except MergeError:
        return None
    items = sorted([e.key, e.norm] for e in parts.module + parts.memory)
    return hashlib.sha256(json.dumps(items).encode()).hexdigest()[:16]


def render(parts: ProgramParts, module_keys: list[str], memory_keys: list[str], pick: dict[str, Element]) -> str:
    """Source text of the chosen elements (``pick``: key → element) in the given orders, under
    ``parts``' module docstring."""
    def nl(t: str) -> str:
        return t if t.endswith("\n") else t + "\n"

    out = [parts.docstring]
    for k in module_keys:
        out.append(nl(pick[k].text))
        if k == "class Memory":
            out += [nl(pick[mk].text) for mk in memory_keys]
    return "".join(out).rstrip("\n") + "\n"
