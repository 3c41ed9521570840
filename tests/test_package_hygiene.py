"""Package code states contracts, not history, and imports flow one way.

docs/design.md § "Layout": ``launch → training, evolution → rewards → data_synth → memory_bank → llm``,
and inside ``evolution`` ``search → execution``. Package code holds no issue or stop numbers and no
dates of this project's era (benchmark data such as LoCoMo's 2023 sessions is not history)."""
from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ORDER = ["llm", "memory_bank", "data_synth", "rewards", "training", "evolution", "launch"]
#: package -> the packages it may import (besides itself)
ALLOWED = {
    "llm": set(),
    "memory_bank": {"llm"},
    "data_synth": {"memory_bank", "llm"},
    "rewards": {"data_synth", "memory_bank", "llm"},
    "training": {"rewards", "data_synth", "memory_bank", "llm"},
    "evolution": {"rewards", "data_synth", "memory_bank", "llm"},
    "launch": {"training", "evolution", "rewards", "data_synth", "memory_bank", "llm"},
}
HISTORY = re.compile(r"\b(?:issue|stop)s? #?\d+\b|\b20(?:2[4-9]|3\d)-\d\d(?:-\d\d)?\b", re.IGNORECASE)


def _files():
    return sorted(f for p in ORDER for f in (ROOT / p).rglob("*.py"))


def _imports(path: Path):
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from ((a.name, node.lineno) for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            yield node.module, node.lineno


def test_imports_flow_one_way():
    bad = []
    for f in _files():
        rel = f.relative_to(ROOT)
        pkg = rel.parts[0]
        for name, line in _imports(f):
            parts = name.split(".")
            top = parts[1] if parts[0] == "memgym" and len(parts) > 1 else parts[0]
            if top in ALLOWED and top != pkg and top not in ALLOWED[pkg]:
                bad.append(f"{rel}:{line} imports {name}")
            if pkg == "evolution" and rel.parts[1] == "execution" and name.startswith("memgym.evolution.search"):
                bad.append(f"{rel}:{line} imports {name} (execution must not import search)")
    assert not bad, "imports that run backwards:\n" + "\n".join(bad)


def _module(path: Path) -> str:
    parts = ["memgym", *path.relative_to(ROOT).with_suffix("").parts]
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_imports(mod: str, source: str, modules: set[str], *, is_package: bool = False) -> set[str]:
    """The modules of ``modules`` that module ``mod`` (source ``source``) imports anywhere, inside
    functions too: relative imports resolved against its package, ``from pkg import submodule``
    counted as the submodule, ``import a.b.attr`` as the module that holds ``attr``."""
    package = mod if is_package else mod.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            targets = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules else base for a in node.names]
        else:
            continue
        for t in targets:
            while t and t not in modules:
                t = t.rpartition(".")[0]
            if t and t != mod:
                out.add(t)
    return out


def import_graph() -> dict[str, set[str]]:
    """``memgym.*`` module -> the ``memgym.*`` modules it imports (:func:`module_imports`)."""
    files = {_module(f): f for f in _files()}
    return {m: module_imports(m, f.read_text(), set(files), is_package=f.name == "__init__.py")
            for m, f in files.items()}


def import_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan 1972), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return sorted(out)


def test_no_import_circle_in_any_package():
    """No two memgym modules import each other, directly or round a loop, even from inside a
    function: a circle is one module split in two files (docs/design.md § "Layout")."""
    cycles = import_cycles(import_graph())
    assert not cycles, "import circles:\n" + "\n".join(" <-> ".join(c) for c in cycles)


def test_the_import_graph_resolves_what_the_circle_test_needs():
    mods = {"memgym.a", "memgym.a.b", "memgym.a.c", "memgym.d"}
    src = "from . import c\nfrom ..d import x\ndef f():\n    import memgym.a.b.attr\n"
    assert module_imports("memgym.a.b", src, mods) == {"memgym.a.c", "memgym.d"}
    assert module_imports("memgym.a", "from .b import y\n", mods, is_package=True) == {"memgym.a.b"}
    assert module_imports("memgym.d", "from memgym.a import c, z\n", mods) == {"memgym.a.c", "memgym.a"}
    assert "memgym.launch.cmd_train" in import_graph()["memgym.launch.cli"]  # from memgym.launch import cmd_train
    assert import_cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert import_cycles({"a": {"b"}, "b": set()}) == []


def test_one_import_name():
    """Every import of memgym's own code goes through ``memgym.``: the folders install as
    ``memgym.<folder>`` (pyproject's package-dir), never as top-level names that shadow other
    packages (PyPI's ``llm``, ``memory-bank``); pyproject lists every package folder."""
    import tomllib

    bare = []
    for f in sorted(ROOT.glob("**/*.py")):
        rel = f.relative_to(ROOT)
        if rel.parts[0] in (".venv", ".git", "runs") or rel.parts[0].startswith(".venv"):
            continue
        for name, line in _imports(f):
            if name.split(".")[0] in ALLOWED:
                bare.append(f"{rel}:{line} imports {name} (write memgym.{name})")
    assert not bare, "imports of a bare top-level name:\n" + "\n".join(bare)
    tool = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    assert tool["package-dir"] == {f"memgym.{p}": p for p in ORDER}
    folders = {"memgym." + ".".join(i.parent.relative_to(ROOT).parts) for p in ORDER for i in (ROOT / p).rglob("__init__.py")
               if "assets" not in i.parts}
    assert set(tool["packages"]) == folders and len(folders) >= 13


def test_package_code_states_no_history():
    hits = []
    for f in _files():
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if HISTORY.search(line):
                hits.append(f"{f.relative_to(ROOT)}:{i}: {line.strip()[:100]}")
    assert not hits, "issue numbers or dates in package code (move history to scripts/experiments):\n" + "\n".join(hits)


def test_the_history_pattern_catches_what_it_should():
    assert HISTORY.search("fixed in issue 20") and HISTORY.search("stop 23, on whole sessions")
    assert HISTORY.search("measured 2026-12-01") and not HISTORY.search("2023-05-08, Monday 8 May 2023")
    assert not HISTORY.search("an issue with the schema") and not HISTORY.search("stop_reason 3")


def test_package_code_cites_the_design_document_in_the_repo():
    """Citations name ``docs/design.md`` and one of its sections, or a paper; never a file outside the repo."""
    headings = {ln.lstrip("#").strip() for ln in (ROOT / "docs" / "design.md").read_text().splitlines()
                if ln.startswith("#")}
    outside, unknown = [], []
    for f in _files():
        text = f.read_text()
        if re.search(r"DESIGN\.md|shared/seeds|seeds/0", text):
            outside.append(str(f.relative_to(ROOT)))
        flat = " ".join(text.split())
        unknown += [f"{f.relative_to(ROOT)}: {s}" for s in re.findall(r"docs/design\.md`{0,2} § [\"']([^\"']+)[\"']", flat)
                    if s not in headings]
    assert not outside, "package code citing files outside the repo: " + ", ".join(outside)
    assert not unknown, "citations of sections docs/design.md does not have:\n" + "\n".join(unknown)
