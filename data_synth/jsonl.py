"""Resumable, append-only JSONL files for long generation runs (synthetic QA, trajectories).

A run writes one line per finished unit (e.g. one session) and nothing else, so a re-run
after a crash — including ``kill -9`` in the middle of a write — resumes exactly:

- on open, every complete line is read and its key recorded as done; a re-run skips those;
- a process killed mid-write leaves at most one *torn* last line (bytes without the final
  newline); it is detected and cut off (the unit is redone), so nothing is duplicated or lost;
- each line goes out in ONE ``os.write`` on an ``O_APPEND`` descriptor followed by
  ``os.fsync``, so a finished line survives a crash of the process or the machine;
- an exclusive ``flock`` on the file stops two runs from writing the same file at once (the
  kernel drops the lock when its process dies, even by SIGKILL).

A complete line (one that ends with a newline) that is not valid JSON cannot come from a torn
write; it is corruption and raises :class:`JsonlCorruptError` instead of being dropped.
"""
from __future__ import annotations

import fcntl
import json
import os
from collections.abc import Callable, Hashable
from pathlib import Path

from llm.errors import MemgymError

__all__ = ["JsonlCorruptError", "JsonlLockedError", "ResumableJsonl", "read_jsonl"]


class JsonlCorruptError(MemgymError, ValueError):
    """A complete line of a resumable JSONL file is not a JSON object, or repeats a key.
    Names the file and the 1-based line number."""

    kind = "data"


class JsonlLockedError(MemgymError, RuntimeError):
    """Another live process holds the file's write lock (names the file)."""

    kind = "locked"


class ResumableJsonl:
    """An append-only JSONL file keyed by ``key(record)``.

    Args:
        path: the file (created with its parent folders if absent).
        key: maps a record (a dict) to a hashable key, e.g. ``(conversation_id, session)``.

    Attributes after opening: ``records`` (the existing records, in file order), ``done``
    (their keys), ``repaired_bytes`` (bytes of a torn last line that were cut off, 0 if none).

    Raises JsonlCorruptError (a broken complete line or a repeated key), JsonlLockedError
    (another process is writing the file). Use as a context manager or call :meth:`close`.
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
        """Write ``record`` as one line (one ``os.write``) and fsync it.

        Raises ValueError when its key is already done (a caller bug that would duplicate a
        unit) or when the record is not JSON-serialisable; nothing is written then."""
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
        """Remove the records of ``keys`` so that their units are redone (e.g. sessions that
        came back empty). The file is rewritten crash-safely: the kept lines go to a temporary
        file that is fsynced and renamed over ``path``; the lock moves to the new file.
        Returns the number of records dropped. Raises JsonlLockedError if another process
        took the renamed file's lock first."""
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
    """``(line number, decoded value)`` of every non-blank line of a JSONL file, 1-based.

    ``error(path, line, field, reason)`` builds the error raised for a file that is not UTF-8
    (line 0, field ``<file>``) or a line that is not JSON (field ``<json>``). With
    ``allow_torn_tail`` a last line without a newline that is not JSON (a writer killed
    mid-line) is skipped. Raises FileNotFoundError ``"<what> not found: <path>"``.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{what} not found: {path}")
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
