"""Resumable, append-only JSONL files for long generation runs: one line per finished unit,
so a re-run after a crash (``kill -9`` mid-write included) resumes exactly. Complete lines mark
their keys done; a torn last line (no newline) is cut off and its unit redone; each line is one
``os.write`` on ``O_APPEND`` plus ``fsync``; an exclusive ``flock`` keeps out a second writer.
A complete line that is not JSON is corruption: :class:`JsonlCorruptError`.
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Hashable
from pathlib import Path

from memgym.llm.errors import MemgymError

__all__ = ["JsonlCorruptError", "JsonlLockedError", "ResumableJsonl", "read_jsonl"]


class JsonlCorruptError(MemgymError, ValueError):
    """A complete line of a resumable JSONL file is not a JSON object, or repeats a key.
    Names the file and the 1-based line number."""

    kind = "data"


class JsonlLockedError(MemgymError, RuntimeError):
    """Another live process holds the file's write lock (names the file)."""

    kind = "locked"


class ResumableJsonl:
    """An append-only JSONL file at ``path`` (created) keyed by ``key(record)``. After opening:
        ``records`` (file order), ``done`` (their keys), ``repaired_bytes`` (torn tail cut off).
        Raises JsonlCorruptError (broken line, repeated key), JsonlLockedError (another writer).
        """

    def __init__(self, path, key: Callable[[dict], Hashable]):
        self.path = Path(path)
        self.key = key
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_APPEND, 0o644)
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._fd)
            raise JsonlLockedError(f"{self.path} is being written by another process; wait for it or use another "
                                   "--out") from None
        try:
            self.records: list[dict] = []
            self.done: set = set()
            self.repaired_bytes = self._load()
        except BaseException:
            os.close(self._fd)
            raise

    def _load(self) -> int:
        data = self.path.read_bytes()
        end = data.rfind(b"\n") + 1  # everything after the last newline is a torn write
        torn = len(data) - end
        for no, raw in enumerate(data[:end].split(b"\n")[:-1], 1):
            if not raw.strip():
                continue
            try:
                obj = json.loads(raw.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                raise JsonlCorruptError(f"{self.path}: line {no} is a complete line but not valid JSON ({e}); "
                                        "the file is corrupt, not torn") from None
            if not isinstance(obj, dict):
                raise JsonlCorruptError(f"{self.path}: line {no} is not a JSON object")
            k = self.key(obj)
            if k in self.done:
                raise JsonlCorruptError(f"{self.path}: line {no} repeats the key {k!r}")
            self.done.add(k)
            self.records.append(obj)
        if torn:
            os.ftruncate(self._fd, end)
            os.fsync(self._fd)
        return torn

    def append(self, record: dict) -> None:
        """Write ``record`` as one fsynced line; ValueError (nothing written) for a done key or non-JSON."""
        k = self.key(record)
        if k in self.done:
            raise ValueError(f"{self.path}: key {k!r} is already written")
        data = (json.dumps(record, ensure_ascii=False) + "\n").encode("utf-8")
        view = memoryview(data)
        while view:
            n = os.write(self._fd, view)
            view = view[n:]
        os.fsync(self._fd)
        self.done.add(k)
        self.records.append(record)

    def drop(self, keys) -> int:
        """Remove the records of ``keys`` (their units are redone): the kept lines are written to a
                fsynced temporary file renamed over ``path``, the lock moving with it. Returns the count
                dropped; JsonlLockedError if another process took the new file's lock first."""
        keys = set(keys)
        kept = [r for r in self.records if self.key(r) not in keys]
        n = len(self.records) - len(kept)
        if not n:
            return 0
        tmp = self.path.with_name(f".{self.path.name}.rewrite-{os.getpid()}")
        with open(tmp, "wb") as f:
            f.write("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in kept).encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, self.path)
        fd = os.open(self.path, os.O_RDWR | os.O_APPEND, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise JsonlLockedError(f"{self.path} was taken by another process while being rewritten") from None
        os.close(self._fd)
        self._fd = fd
        self.records = kept
        self.done = {self.key(r) for r in kept}
        return n

    def close(self) -> None:
        """Release the lock and close the file (idempotent)."""
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> "ResumableJsonl":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def read_jsonl(path, error: Callable[[Path, int, str, str], Exception], *, what: str,
               allow_torn_tail: bool = False) -> list[tuple[int, object]]:
    """``(line number, value)`` of every non-blank line, 1-based; ``error(path, line, field, reason)``
        builds the error for non-UTF-8 or non-JSON lines; ``allow_torn_tail`` skips a torn last line.
        The file is recorded as an input of the run (:func:`memgym.data_synth.paths.record_read`). FileNotFoundError ``"<what> not found: <path>"``."""
    from memgym.data_synth.paths import record_read

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
    record_read(path, what)
    try:
        lines = path.read_bytes().decode("utf-8").split("\n")
    except UnicodeDecodeError as e:
        raise error(path, 0, "<file>", f"not UTF-8 text: {e}") from None
    out = []
    for i, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            out.append((i, json.loads(text)))
        except ValueError as e:
            if allow_torn_tail and i == len(lines):
                break
            raise error(path, i, "<json>", f"invalid JSON: {e}") from None
    return out
