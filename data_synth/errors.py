"""Typed errors and warnings of the benchmark loaders: broken input raises one error naming
file, record and field; real-file quirks give a :class:`DataQuirkWarning`, never a crash."""
from __future__ import annotations

from pathlib import Path

from memgym.llm.errors import MemgymError


class DataFormatError(MemgymError, ValueError):
    """A benchmark file is broken: ``"file F, record R, field X: reason"``. ``record`` is the
        record's id, else ``"#<index>"`` (0-based), ``"-"`` for the whole file; ``field`` a path such as
        ``"conversation.session_3[2].dia_id"`` or ``"-"``.
        """

    kind = "data"

    def __init__(self, file: str | Path, record: str, field: str, reason: str):
        self.file = str(file)
        self.record = str(record)
        self.field = str(field)
        self.reason = reason
        super().__init__(f"file {self.file}, record {self.record}, field {self.field}: {reason}")

    def __reduce__(self):  # keep the four attributes through pickling (multiprocessing)
        return (type(self), (self.file, self.record, self.field, self.reason))


class DataFileNotFoundError(FileNotFoundError):
    """A data file memgym needs is absent (``path``); the message says how to point at the data."""

    def __init__(self, message: str, path: str | Path):
        self.path = str(path)
        super().__init__(message)

    def __str__(self) -> str:
        return self.args[0]

    def __reduce__(self):
        return (type(self), (self.args[0], self.path))


class DataQuirkWarning(UserWarning):
    """A real-file quirk the loader repaired or dropped (one warning per record, summarising
    counts), e.g. int answers converted to strings or unknown evidence ids dropped."""


def get_field(obj, key: str, types, file, record: str, field: str, *, optional: bool = False):
    """``obj[key]`` checked against ``types`` (``bool`` is never ``int``); ``field``: the path in
        errors; ``optional``: missing or null gives None. DataFormatError otherwise.
        """
    if not isinstance(obj, dict):
        parent = field.rsplit(".", 1)[0] if "." in field else "-"
        raise DataFormatError(file, record, parent, f"expected a JSON object, got "
                                                    f"{type(obj).__name__}")
    if key not in obj or obj[key] is None:
        if optional:
            return None
        raise DataFormatError(file, record, field, "missing required key")
    val = obj[key]
    tt = types if isinstance(types, tuple) else (types,)
    if not isinstance(val, tt) or (isinstance(val, bool) and bool not in tt):
        names = " or ".join(t.__name__ for t in tt)
        raise DataFormatError(file, record, field, f"expected {names}, got {type(val).__name__} "
                                                   f"{str(val)[:40]!r}")
    return val


class QuirkLog:
    """Counts a record's (or file's) repaired/dropped quirks and emits ONE :class:`DataQuirkWarning`."""

    def __init__(self, where: str, max_examples: int = 3):
        self.where = where
        self.max_examples = max_examples
        self.counts: dict[str, int] = {}
        self.examples: dict[str, list[str]] = {}

    def add(self, kind: str, example: str | None = None) -> None:
        """Record one occurrence of ``kind`` (a plural noun phrase, e.g. "int answers converted
        to str"), keeping up to ``max_examples`` examples."""
        self.counts[kind] = self.counts.get(kind, 0) + 1
        ex = self.examples.setdefault(kind, [])
        if example is not None and len(ex) < self.max_examples:
            ex.append(example)

    def __bool__(self) -> bool:
        return bool(self.counts)

    def message(self) -> str:
        """``"<where>: <n> <kind> (e.g. ex1, ex2); ..."``, kinds in first-seen order."""
        parts = []
        for kind, n in self.counts.items():
            ex = self.examples.get(kind)
            parts.append(f"{n} {kind}" + (f" (e.g. {', '.join(ex)})" if ex else ""))
        return f"{self.where}: " + "; ".join(parts)

    def emit(self, stacklevel: int = 3) -> None:
        """Issue the single summary warning if anything was recorded."""
        if self.counts:
            import warnings

            warnings.warn(DataQuirkWarning(self.message()), stacklevel=stacklevel)


def record_id(file, i: int, rec, key: str) -> str:
    """The str id ``rec[key]`` of the ``i``-th record of ``file``; :class:`DataFormatError` otherwise."""
    if not isinstance(rec, dict):
        raise DataFormatError(file, f"#{i}", "-", f"expected a JSON object, got {type(rec).__name__}")
    return get_field(rec, key, str, file, f"#{i}", key)


class DataChecksumError(MemgymError, ValueError):
    """A downloaded or derived data file whose sha256 is not the recorded one (``file``, ``expected``,
        ``actual``, ``source``: where its bytes came from); nothing was written in its place."""

    kind = "data"

    def __init__(self, file: str | Path, expected: str, actual: str, source: str = ""):
        self.file, self.expected, self.actual, self.source = str(file), expected, actual, source
        super().__init__(f"checksum mismatch for {self.file}: expected sha256 {expected}, got {actual}"
                         + (f" (from {source})" if source else "") + "; nothing was written")

    def __reduce__(self):
        return (type(self), (self.file, self.expected, self.actual, self.source))


class DownloadError(MemgymError, OSError):
    """A download that reached its host but failed: an HTTP error status, or a transfer cut more often
        than the retries allow (its ``.part`` stays, so that running again resumes it)."""

    kind = "data"


class NoNetworkError(MemgymError, OSError):
    """A data host cannot be reached (``url``, ``reason``); ``memgym data download`` turns it into one
        line naming every file still to fetch and where from."""

    kind = "offline"

    def __init__(self, url: str, reason: str):
        self.url, self.reason = url, reason
        super().__init__(f"cannot reach {url}: {reason}")

    def __reduce__(self):
        return (type(self), (self.url, self.reason))
