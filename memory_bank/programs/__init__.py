"""Built-in memory programs, shipped as source files that are loaded by path.

- ``seed.py``: the PrisMem seed program (appends units in input order; retrieve returns their
  concatenation truncated to ``OUT_CHAR_BUDGET``; no query-dependent ranking).
- ``reference.py``: a dense-retrieval reference (dated units, an embedding index, a planned
  search text with an optional time hint, cosine top-k and greedy budget packing).

Both follow the contract in :mod:`memory_bank.program` and import only allow-listed modules,
so they run unchanged inside ``evolution.execution.sandbox``.
"""
from __future__ import annotations

from pathlib import Path

PROGRAMS_DIR = Path(__file__).resolve().parent


def seed_program_path() -> Path:
    """Absolute path of the seed program's source file."""
    return PROGRAMS_DIR / "seed.py"


def reference_program_path() -> Path:
    """Absolute path of the reference program's source file."""
    return PROGRAMS_DIR / "reference.py"


def read_program_source(path: str | Path) -> str:
    """The UTF-8 source text of a program file (FileNotFoundError names the path)."""
    p = Path(path)
    if not p.is_file():
        raise FileNotFoundError(f"memory program not found: {p}")
    return p.read_text(encoding="utf-8")
