"""A memory program's five components (+ shared helpers), each one's normalised-AST hash, and
the earliest pipeline stage a revision invalidates.

Source: PrisMem (arXiv 2610.06361), appendix "revision-aware
execution reuse" (Table 6): re-execution begins at the earliest affected stage; shared helpers
invalidate indexing. Components: ``extraction`` (EXTRACTION_INSTRUCTION, MemoryUnit),
``indexing`` (class Memory except ``retrieve``), ``planning`` (PLANNING_INSTRUCTION, Query),
``retrieval`` (``Memory.retrieve``), ``answer`` (ANSWER_INSTRUCTION), ``shared`` (any other
top-level statement). A hash is the sha256 of the ``ast.dump`` (docstrings removed) of the
component's statements, so comments, formatting and docstrings never count as a change.
"""
from __future__ import annotations

import ast
import copy
import hashlib
from dataclasses import dataclass

COMPONENTS: tuple[str, ...] = ("extraction", "indexing", "planning", "retrieval", "answer", "shared")
"""Component names, in the order of the stage each one first affects."""

STAGES: tuple[str, ...] = ("extract", "index", "plan", "retrieve", "answer", "score")
"""Pipeline stages in execution order (PrisMem: extract → index → plan → retrieve → answer)."""

COMPONENT_STAGE: dict[str, str] = {
    "extraction": "extract", "indexing": "index", "shared": "index", "planning": "plan",
    "retrieval": "retrieve", "answer": "answer",
}
"""The first stage a change of each component invalidates (shared helpers: from indexing on)."""

NAMED_COMPONENTS = {"EXTRACTION_INSTRUCTION": "extraction", "PLANNING_INSTRUCTION": "planning",
                    "ANSWER_INSTRUCTION": "answer", "MemoryUnit": "extraction", "Query": "planning"}
"""The component of each contract name (every other top-level name is ``shared``)."""


def _strip_docstring(node: ast.AST) -> None:
    for n in ast.walk(node):
        body = getattr(n, "body", None)
        if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and body \
                and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                and isinstance(body[0].value.value, str):
            n.body = body[1:] or [ast.Pass()]


def _dump(node: ast.AST) -> str:
    return ast.dump(node, annotate_fields=False, include_attributes=False)


def normalised_ast(source: str) -> str:
    """``ast.dump`` of ``source`` without docstrings, comments, formatting or line numbers, so
    two sources compare equal iff they differ only in those. Raises SyntaxError."""
    tree = ast.parse(source)
    _strip_docstring(tree)
    return _dump(tree)


def normalised_dump(node: ast.AST) -> str:
    """``ast.dump`` of ``node`` (left unchanged) without docstrings or line numbers."""
    node = copy.deepcopy(node)
    _strip_docstring(node)
    return _dump(node)


def _targets(stmt: ast.stmt) -> list[str]:
    if isinstance(stmt, ast.Assign):
        return [t.id for t in stmt.targets if isinstance(t, ast.Name)]
    if isinstance(stmt, (ast.AnnAssign, ast.AugAssign)) and isinstance(stmt.target, ast.Name):
        return [stmt.target.id]
    if isinstance(stmt, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        return [stmt.name]
    return []


def component_dumps(source: str) -> dict[str, list[str]]:
    """``{component: [dump, ...]}`` for every name of :data:`COMPONENTS`, in source order; an
    assignment also naming other targets is ``shared``. Raises ``SyntaxError`` for bad source.
    """
    tree = ast.parse(source)
    _strip_docstring(tree)
    out: dict[str, list[str]] = {c: [] for c in COMPONENTS}
    for stmt in tree.body:
        names = _targets(stmt)
        if isinstance(stmt, ast.ClassDef) and stmt.name == "Memory":
            rest = []
            for item in stmt.body:
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef)) and item.name == "retrieve":
                    out["retrieval"].append(_dump(item))
                else:
                    rest.append(item)
            shell = ast.ClassDef(name=stmt.name, bases=stmt.bases, keywords=stmt.keywords, body=rest or [ast.Pass()],
                                 decorator_list=stmt.decorator_list)
            if hasattr(stmt, "type_params"):  # Python >= 3.12
                shell.type_params = stmt.type_params
            out["indexing"].append(_dump(shell))
            continue
        kinds = {NAMED_COMPONENTS.get(n, "shared") for n in names} or {"shared"}
        out[kinds.pop() if len(kinds) == 1 else "shared"].append(_dump(stmt))
    return out


def component_hashes(source: str) -> dict[str, str]:
    """``{component: sha256 hex}`` of :func:`component_dumps` (each list joined by newlines).
    Raises ``SyntaxError`` for unparsable source."""
    return {c: hashlib.sha256("\n".join(d).encode("utf-8")).hexdigest()
            for c, d in component_dumps(source).items()}


@dataclass(frozen=True)
class ComponentDiff:
    """``changed`` components (in :data:`COMPONENTS` order), ``start_stage`` (None when nothing
    changed) and ``reused_stages`` (the stages before it; all but ``score`` when nothing changed).
    """

    changed: tuple[str, ...]
    start_stage: str | None

    @property
    def reused_stages(self) -> tuple[str, ...]:
        if self.start_stage is None:
            return STAGES[:-1]
        return STAGES[: STAGES.index(self.start_stage)]

    def to_dict(self) -> dict:
        return {"changed": list(self.changed), "start_stage": self.start_stage,
                "reused_stages": list(self.reused_stages)}


def start_stage_for(changed: list[str] | tuple[str, ...]) -> str | None:
    """The earliest stage invalidated by the ``changed`` components (None for none).
    Raises ValueError naming an unknown component."""
    bad = [c for c in changed if c not in COMPONENT_STAGE]
    if bad:
        raise ValueError(f"unknown component(s) {bad}; expected {', '.join(COMPONENTS)}")
    stages = [STAGES.index(COMPONENT_STAGE[c]) for c in changed]
    return STAGES[min(stages)] if stages else None


def diff_components(parent_source: str, child_source: str) -> ComponentDiff:
    """Compare a child program with its parent. Raises ``SyntaxError`` when either does not parse."""
    a, b = component_hashes(parent_source), component_hashes(child_source)
    changed = tuple(c for c in COMPONENTS if a[c] != b[c])
    return ComponentDiff(changed, start_stage_for(changed))


def stage_component_hashes(hashes: dict[str, str]) -> dict[str, str]:
    """One cumulative hash per stage over every component whose first invalidated stage is at or
    before it (``score`` = ``answer``). Raises KeyError for a component missing from ``hashes``.
    """
    out, acc = {}, hashlib.sha256()
    for stage in STAGES:
        for comp in COMPONENTS:
            if COMPONENT_STAGE.get(comp) == stage:
                acc.update(f"{comp}={hashes[comp]};".encode())
        out[stage] = acc.copy().hexdigest()
    return out
