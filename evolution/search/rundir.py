"""The run directory of ``memgym evolve``: atomic JSON/text writes and the file layout.

Layout (DESIGN.md § "Run state")::

    DIR/recipe.json          the recipe as run (``--resume`` reads it)
    DIR/seed.py              the starting program
    DIR/state.json           archive, RNG state, ledger, history, next round (after every round)
    DIR/candidates/<id>/     program.py, proposal.json (prompt/response transcript, edits,
                             outcome, RNG state after it), validation.json, eval.json
                             (train/valid scores, diagnostics, usage), revise.json,
                             outcome.json (status, reason, what it became)
    DIR/stages.sqlite        stage-output cache;  DIR/responses.sqlite  LLM response cache
    DIR/report.md, capabilities.png, summary.json, best.py

Every file is written to a temporary name in the same folder and renamed over the target
(``os.replace``), so a kill -9 leaves either the old or the new file, never half of one.
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | Path, value) -> None:
    """Write ``value`` as indented JSON atomically."""
    atomic_write_text(path, json.dumps(value, indent=1, ensure_ascii=False, default=str))


def read_json(path: str | Path, default=None):
    """The JSON value at ``path``, or ``default`` when the file does not exist."""
    p = Path(path)
    if not p.exists():
        return default
    return json.loads(p.read_text(encoding="utf-8"))


class RunDir:
    """Paths of one run directory (see the module doc)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def cand(self, cid: str) -> Path:
        return self.root / "candidates" / cid

    def step(self, cid: str, name: str) -> Path:
        """``candidates/<cid>/<name>.json``."""
        return self.cand(cid) / f"{name}.json"

    def load_step(self, cid: str, name: str):
        return read_json(self.step(cid, name))

    def save_step(self, cid: str, name: str, value) -> None:
        atomic_write_json(self.step(cid, name), value)

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.json"
