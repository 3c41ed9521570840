"""Building blocks of the stage-cached runner: the stage output cache, cache keys and the
host-side extract and plan prompts. Source: PrisMem (arXiv 2610.06361),
appendices "memory interface" and "revision-aware execution reuse". Lengths in characters.
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from typing import Any

from memgym.llm.base import BackendSpecError
from memgym.memory_bank.program import FieldSpec, schema_hint
from memgym.memory_bank.schema import Session

CACHE_FORMAT = "memgym-stages-v1"
"""Mixed into every key so that a change of the runner's output format never reads old values."""


def stable_hash(*parts: Any) -> str:
    """sha256 hex of the canonical JSON (sorted keys, no spaces) of ``parts``.

    Every part must be JSON-serialisable (TypeError otherwise)."""
    text = json.dumps([CACHE_FORMAT, *parts], sort_keys=True, ensure_ascii=False, separators=(",", ":"))
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def session_fingerprint(session: Session) -> str:
    """Hash of everything a session shows an extractor: index, id, dates and every turn
    (id, speaker, text, image caption)."""
    return stable_hash(session.index, session.id, session.date.isoformat() if session.date else None,
                       session.date_text, [[t.id, t.speaker, t.text, t.image_caption] for t in session.turns])


class StageCache:
    """Stage outputs keyed by (stage, key): a dict in front of an optional sqlite file (WAL).
    Values are immutable ``bytes`` (JSON or a sandbox snapshot); ``hits``/``misses`` count
    lookups. ``snapshots`` False: built memories (the ``index`` stage) have no later reader here,
    so the runner takes no snapshot (:meth:`wants`). Thread-safe.
    """

    def __init__(self, path: str | Path | None = None, *, snapshots: bool = True):
        self.path = None if path is None else Path(path)
        self.snapshots = snapshots
        self._mem: dict[tuple[str, str], bytes] = {}
        self._lock = threading.Lock()
        self._conn = None
        self.hits = self.misses = 0
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            from memgym.llm.cache import open_cache_db  # CacheCorruptError names the file and the recovery

            self._conn = open_cache_db(str(self.path), "CREATE TABLE IF NOT EXISTS stages (stage TEXT NOT NULL, "
                                                       "key TEXT NOT NULL, value BLOB NOT NULL, PRIMARY KEY (stage, key))",
                                       "stage", "with --stage_cache none")

    def wants(self, stage: str) -> bool:
        """Whether outputs of ``stage`` are kept (every stage but ``index`` without ``snapshots``)."""
        return self.snapshots or stage != "index"

    def get(self, stage: str, key: str) -> bytes | None:
        """The stored bytes, or None."""
        with self._lock:
            v = self._mem.get((stage, key))
            if v is None and self._conn is not None:
                row = self._conn.execute("SELECT value FROM stages WHERE stage=? AND key=?", (stage, key)).fetchone()
                if row is not None:
                    v = self._mem[(stage, key)] = bytes(row[0])
            if v is None:
                self.misses += 1
            else:
                self.hits += 1
            return v

    def put(self, stage: str, key: str, value: bytes) -> None:
        """Store ``value`` (bytes) in memory and, when persistent, on disk."""
        if not isinstance(value, (bytes, bytearray)):
            raise TypeError(f"StageCache.put({stage!r}): value must be bytes, got {type(value).__name__}")
        value = bytes(value)
        with self._lock:
            self._mem[(stage, key)] = value
            if self._conn is not None:
                self._conn.execute("INSERT OR REPLACE INTO stages (stage, key, value) VALUES (?, ?, ?)",
                                   (stage, key, value))

    def get_json(self, stage: str, key: str) -> Any | None:
        """The decoded JSON value (a fresh object on every call), or None when absent."""
        raw = self.get(stage, key)
        return None if raw is None else json.loads(raw.decode("utf-8"))

    def put_json(self, stage: str, key: str, value: Any) -> None:
        """Store a JSON-serialisable ``value`` (TypeError otherwise)."""
        self.put(stage, key, json.dumps(value, ensure_ascii=False, sort_keys=True).encode("utf-8"))

    def __len__(self) -> int:
        with self._lock:
            if self._conn is not None:
                return int(self._conn.execute("SELECT COUNT(*) FROM stages").fetchone()[0])
            return len(self._mem)

    def close(self) -> None:
        """Close the sqlite file (the in-memory part stays usable)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


# --------------------------------------------------------------------------- prompts


def extraction_messages(instruction: str, session: Session, speakers: tuple[str, ...],
                        unit_fields: tuple[FieldSpec, ...]) -> list[dict]:
    """Instruction-mode extraction prompt (PrisMem style): system = the program's
    ``EXTRACTION_INSTRUCTION``; user = the session date, speakers, transcript (``[id] speaker:
    text`` lines) and the unit schema. The answer is parsed as a JSON list of MemoryUnit."""
    date = session.date_text or (session.date.isoformat() if session.date else "unknown")
    user = (f"Session {session.index} date: {date}\n"
            f"Speakers: {', '.join(speakers)}\n\nTranscript:\n{session.transcript()}\n\n"
            f"Answer with a JSON list of memory units; each unit is an object with the fields "
            f"{schema_hint(unit_fields)}.")
    return [{"role": "system", "content": instruction}, {"role": "user", "content": user}]


def planning_messages(instruction: str, question: str, question_date: str | None,
                      query_fields: tuple[FieldSpec, ...]) -> list[dict]:
    """Planning prompt: system = ``PLANNING_INSTRUCTION``; user = the question (and its date
    when known) and the Query schema. The answer is parsed as ONE Query object."""
    date = f"Question date: {question_date}\n" if question_date else ""
    user = (f"{date}Question: {question}\n\nAnswer with one JSON object with the fields "
            f"{schema_hint(query_fields)}.")
    return [{"role": "system", "content": instruction}, {"role": "user", "content": user}]


# --------------------------------------------------------------------------- cache identities


def model_identity(spec: str) -> str:
    """A cache identity for a backend spec: ``spec@<dir fingerprint>`` for local ``hf:``/``vllm:``
    dirs (retraining in place changes it), the spec itself otherwise."""
    from memgym.llm.paths import dir_fingerprint
    from memgym.llm.specs import parse_spec, resolve_model_path

    try:
        s = parse_spec(spec)
        if s.kind in ("hf", "vllm"):
            return f"{spec}@{dir_fingerprint(resolve_model_path(s))}"
    except (BackendSpecError, FileNotFoundError):
        pass
    return spec


def file_sha(path: Path) -> str:
    """First 16 hex digits of the sha256 of a file's bytes."""
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()[:16]
