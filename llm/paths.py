"""Filesystem locations used by the ``llm`` package, and a cheap model-directory fingerprint.

``cache_dir()`` is where prepared models, response caches and embedding caches live:
``$MEMGYM_CACHE`` when set, else ``~/.cache/memgym``. Source: ``DESIGN.md`` § "Embedded
defaults" (step 4, "save_pretrained once into a cache dir").
"""
from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

_FINGERPRINT_HEAD_BYTES = 1 << 20  # 1 MiB read from the start of each weights file


def cache_dir() -> Path:
    """Return memgym's cache directory, creating it (and parents) if needed.

    ``$MEMGYM_CACHE`` wins when set and non-empty (made absolute); otherwise ``~/.cache/memgym``.
    Raises ``NotADirectoryError`` when the path exists and is not a directory.
    """
    env = os.environ.get("MEMGYM_CACHE", "").strip()
    path = Path(os.path.abspath(Path(env).expanduser())) if env else Path.home() / ".cache" / "memgym"
    if path.exists() and not path.is_dir():
        raise NotADirectoryError(f"memgym cache path {path} (from $MEMGYM_CACHE or ~/.cache/memgym) is not a directory")
    path.mkdir(parents=True, exist_ok=True)
    return path


def dir_fingerprint(path: str | Path) -> str:
    """A 12-hex-digit fingerprint of a model directory, for cache keys.

    Hashes (sha256) the text of every ``*.json`` file at the top level of ``path`` and, for
    each ``*.safetensors`` / ``*.bin`` / ``*.gguf`` file, its name, its size in bytes and its
    first 1 MiB. Retraining into the same directory therefore changes the fingerprint
    (the header and the first tensors change), while hashing stays cheap for multi-GB models.
    Raises ``FileNotFoundError`` when ``path`` is not a directory.
    """
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
