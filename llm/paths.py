"""memgym's cache directory and a cheap model-directory fingerprint."""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

_FINGERPRINT_HEAD_BYTES = 1 << 20  # 1 MiB read from the start of each weights file


def cache_dir() -> Path:
    """``$MEMGYM_CACHE`` (absolute) or ``~/.cache/memgym``, created; NotADirectoryError for a file."""
    env = os.environ.get("MEMGYM_CACHE", "").strip()
    path = Path(os.path.abspath(Path(env).expanduser())) if env else Path.home() / ".cache" / "memgym"
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"memgym cache path {path} (from $MEMGYM_CACHE or ~/.cache/memgym) is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def dir_fingerprint(path: str | Path) -> str:
    """12 hex of the sha256 over the top-level ``*.json`` files and each weights file's name, size
    and first 1 MiB (cheap, and changed by retraining). FileNotFoundError for a missing dir."""

    p = Path(path)
    if not p.is_dir():
        raise FileNotFoundError(f"model directory {p} does not exist")
    h = hashlib.sha256()
    for f in sorted(p.iterdir()):
        if not f.is_file():
            continue
        if f.suffix == ".json":
            h.update(f.name.encode())
            h.update(f.read_bytes())
        elif f.suffix in (".safetensors", ".bin", ".gguf"):
            h.update(json.dumps([f.name, f.stat().st_size]).encode())
            with f.open("rb") as fh:
                h.update(fh.read(_FINGERPRINT_HEAD_BYTES))
    return h.hexdigest()[:12]
