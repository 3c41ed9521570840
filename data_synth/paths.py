"""Where memgym finds its read-only data: ``$MEMGYM_DATA`` or ``../shared/data``; a missing file
fails with a message saying where it is expected."""
from __future__ import annotations

import os
from pathlib import Path

from memgym.data_synth.errors import DataFileNotFoundError

ENV_VAR = "MEMGYM_DATA"
REPO_ROOT = Path(__file__).resolve().parents[1]


def data_root() -> Path:
    """``$MEMGYM_DATA`` as given (absent too), else the first existing of ``<cwd>/../shared/data``
        and ``<repo>/../shared/data``, else the latter; absolute."""
    env = os.environ.get(ENV_VAR)
    if env:
        return Path(env).expanduser().resolve()
    cands = [Path.cwd() / ".." / "shared" / "data", REPO_ROOT / ".." / "shared" / "data"]
    for c in cands:
        if c.is_dir():
            return c.resolve()
    return cands[-1].resolve()


def require(path: Path | str, what: str) -> Path:
    """``path`` if it exists, else DataFileNotFoundError naming ``what``, the path and ``MEMGYM_DATA``."""
    p = Path(path)
    if p.exists():
        return p
    raise DataFileNotFoundError(
        f"{what} not found: expected at {p}. Set {ENV_VAR} to the folder that holds "
        f"locomo/, longmemeval/ and beam/ (default ../shared/data) or pass an explicit --path.",
        p,
    )


def locomo_path() -> Path:
    """``<data root>/locomo/locomo10.json`` (not checked for existence; see :func:`require`)."""
    return data_root() / "locomo" / "locomo10.json"


def longmemeval_oracle_path() -> Path:
    """``<data root>/longmemeval/longmemeval_oracle.json`` (not checked for existence)."""
    return data_root() / "longmemeval" / "longmemeval_oracle.json"


def longmemeval_splits_path() -> Path:
    """``<data root>/longmemeval/splits.json`` (not checked for existence)."""
    return data_root() / "longmemeval" / "splits.json"


def expert_dir() -> Path:
    """``<data root>/expert`` holding ``conv-26.jsonl`` and ``conv-30.jsonl`` (not checked)."""
    return data_root() / "expert"


def record_read(path: Path | str, what: str, spec: str | None = None) -> None:
    """Note ``path`` as an input of this run for its run card (:func:`memgym.llm.runcard.record_input`),
    relative to the data root when under it."""
    from memgym.llm.runcard import record_input

    record_input(path, what, data_root=data_root(), spec=spec)


def read_json(path: Path | str, what: str):
    """The parsed JSON value of a file (after :func:`require`, recorded by :func:`record_read`);
        DataFormatError (line, column) when it is not UTF-8 JSON."""
    import json

    from memgym.data_synth.errors import DataFormatError

    p = require(path, what)
    record_read(p, what)
    try:
        with open(p, encoding="utf-8") as fh:
            return json.load(fh)
    except json.JSONDecodeError as e:
        raise DataFormatError(p, "-", "-", f"invalid JSON at line {e.lineno} column {e.colno}: "
                                           f"{e.msg}") from None
    except UnicodeDecodeError as e:
        raise DataFormatError(p, "-", "-", f"not UTF-8 text ({e.reason} at byte {e.start})") \
            from None
    except IsADirectoryError:
        raise DataFormatError(p, "-", "-", "is a folder, expected a JSON file") from None
