"""Built-in memory programs, shipped as source files that are loaded by path.

- ``seed.py``: the PrisMem seed program (appends units in input order; retrieve returns their
  concatenation truncated to ``OUT_CHAR_BUDGET``; no query-dependent ranking).
- ``reference.py``: a dense-retrieval reference (dated units, an embedding index, a planned
  search text with an optional time hint, cosine top-k and greedy budget packing).
- static retrieval baselines (issue 20), programs like any evolved one: ``bm25.py`` (BM25 over
  the rendered units), ``dense_topk.py`` (cosine top-k), ``hybrid_rrf.py`` (BM25 + dense fused
  by reciprocal rank). :data:`BASELINES` names them with the seed (full-history truncation)
  and the reference program.

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


BASELINES: dict[str, str] = {"full_history": "seed.py", "bm25": "bm25.py", "dense_topk": "dense_topk.py",
                             "hybrid_rrf": "hybrid_rrf.py", "reference": "reference.py"}
"""Baseline name → program file in this folder (``full_history`` is the seed: the first 16,000
characters of the history, unranked)."""


def baseline_program_path(name: str) -> Path:
    """Absolute path of the baseline program ``name`` (KeyError listing :data:`BASELINES`)."""
    if name not in BASELINES:
        raise KeyError(f"no baseline program {name!r}; known: {', '.join(BASELINES)}")
    return PROGRAMS_DIR / BASELINES[name]


def read_program_source(path: str | Path) -> str:
    """The UTF-8 source text of a program file (:class:`llm.errors.ConfigError` names a missing path)."""
    from llm.errors import ConfigError

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"memory program not found: {p}")
    return p.read_text(encoding="utf-8")
