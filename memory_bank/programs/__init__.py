"""Built-in memory programs, shipped as source files loaded by path: ``bank.py`` (MemBuilder's
four-part bank: the core block plus the top-10 entries by cosine; what ``memgym eval`` runs),
``seed.py`` (PrisMem's seed: units in input order, truncated, unranked), ``reference.py`` (dense
retrieval with planning) and the static retrieval baselines ``bm25.py``, ``dense_topk.py``,
``hybrid_rrf.py`` (:data:`BASELINES`). All follow :mod:`memgym.memory_bank.contract`'s contract and run
unchanged in ``memgym.evolution.execution.sandbox``.
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
    """The UTF-8 source text of a program file, recorded as an input of the run
    (:func:`memgym.llm.runcard.record_input`; :class:`memgym.llm.errors.ConfigError` names a missing path)."""
    from memgym.llm.errors import ConfigError

    from memgym.llm.runcard import record_input

    p = Path(path)
    if not p.is_file():
        raise ConfigError(f"memory program not found: {p}")
    record_input(p, "memory program")
    return p.read_text(encoding="utf-8")


def bank_program_path() -> Path:
    """Absolute path of ``bank.py``: MemBuilder's four-part bank as a program (``memgym eval``'s default)."""
    return PROGRAMS_DIR / "bank.py"
