"""The static first filter of the sandbox (AST): imports outside
:data:`DEFAULT_ALLOWED_IMPORTS`, forbidden names and introspection attributes, in the program's
source (:func:`static_check`) and in source it has compiled at run time
(:func:`introspection_problems`).
"""
from __future__ import annotations

import ast

DEFAULT_ALLOWED_IMPORTS = frozenset({
    "math", "re", "json", "dataclasses", "typing", "collections", "itertools", "functools", "heapq", "bisect",
    "datetime", "statistics", "string", "textwrap", "difflib", "enum", "abc", "copy", "numpy", "__future__",
    "operator", "random", "calendar", "unicodedata",
})
"""Top-level modules a memory program may import."""

FORBIDDEN_NAMES = frozenset({"eval", "exec", "compile", "__import__", "breakpoint", "input", "globals", "locals",
                             "__builtins__", "__loader__", "__spec__", "exit", "quit", "help"})
INTROSPECTION_ATTRS = frozenset({
    "__subclasses__", "__globals__", "__builtins__", "__code__", "__closure__", "__base__", "__bases__", "__mro__",
    "mro", "__self__", "__func__", "__wrapped__", "__traceback__", "__loader__", "__spec__", "__import__",
    "__reduce__", "__reduce_ex__", "__getattribute__", "tb_frame", "tb_next", "f_globals", "f_locals", "f_builtins",
    "f_back", "f_code", "gi_frame", "gi_code", "cr_frame", "cr_code", "ag_frame", "co_code",
})
"""Attributes that lead from an ordinary object to frames, code, globals or the class graph; also
refused at run time when the name is computed (``getattr``, :mod:`memgym.evolution.execution.module_view`)
and in source compiled at run time (:func:`introspection_problems`)."""
FORBIDDEN_ATTRS = INTROSPECTION_ATTRS | frozenset({
    # modules reachable as attributes of allowed modules (e.g. typing.sys, re.os); at run time every
    # module object outside the allow list is refused by object (memgym.evolution.execution.module_view)
    "sys", "os", "builtins", "posix", "importlib", "subprocess", "shutil", "ctypes", "socket", "io", "_io", "_os",
    "_sys",
})


def static_check(source: str, allowed_imports: frozenset = DEFAULT_ALLOWED_IMPORTS) -> list[str]:
    """Problems in ``source`` as ``"line N: ..."`` strings ([] = ok): empty source, syntax errors,
    disallowed or relative imports, :data:`FORBIDDEN_NAMES`, :data:`FORBIDDEN_ATTRS` as attributes
    or string constants.
    """
    if not source.strip():
        return ["source is empty"]
    try:
        tree = ast.parse(source)
    except SyntaxError as e:
        return [f"line {e.lineno}: syntax error: {e.msg}"]
    problems: list[tuple[int, str]] = []
    for node in ast.walk(tree):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.name.partition(".")[0] not in allowed_imports:
                    problems.append((line, f"line {line}: import of {a.name!r} is not allowed"))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                problems.append((line, f"line {line}: relative import is not allowed"))
            elif (node.module or "").partition(".")[0] not in allowed_imports:
                problems.append((line, f"line {line}: import from {node.module!r} is not allowed"))
        elif isinstance(node, ast.Name) and node.id in FORBIDDEN_NAMES:
            problems.append((line, f"line {line}: use of {node.id!r} is not allowed"))
        elif isinstance(node, ast.Attribute) and node.attr in FORBIDDEN_ATTRS:
            problems.append((line, f"line {line}: access to attribute {node.attr!r} is not allowed"))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in FORBIDDEN_ATTRS \
                and node.value.startswith("__"):
            problems.append((line, f"line {line}: string {node.value!r} names a forbidden attribute"))
    return [msg for _, msg in sorted(problems, key=lambda p: p[0])]


def introspection_problems(source: str | bytes) -> list[str]:
    """The :data:`INTROSPECTION_ATTRS` rule of :func:`static_check` alone, for source compiled at
    run time (``typing`` forward references, ``dataclasses``' generated methods): ``"line N:
    ..."`` per attribute or string constant naming one ([] also when ``source`` does not parse)."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    out = []
    for node in ast.walk(tree):
        name = node.attr if isinstance(node, ast.Attribute) else (
            node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None)
        if name in INTROSPECTION_ATTRS:
            out.append(f"line {getattr(node, 'lineno', 0)}: {name!r} in code compiled at run time")
    return out
