"""The stage output cache of the program runner and its keys. Source: PrisMem (arXiv 2610.06361),
appendix "revision-aware execution reuse".

A stage's key hashes :data:`CACHE_FORMAT`, the stage's program component hash, its inputs and
:func:`stage_settings`: the effective values of the settings fields :data:`STAGE_SETTINGS` names for
that stage (a field that does not apply under the current modes enters as None; models by
:func:`spec_identity`). Every other field of
:class:`~memgym.evolution.execution.settings.RunnerSettings` is declared in :data:`KEY_NEUTRAL` with
the reason it cannot change a stage's output (tests/evolution/execution/test_stage_cache.py
changes each field and checks the keys).
"""
from __future__ import annotations

import hashlib
import json
import threading
from pathlib import Path
from collections.abc import Callable
from typing import Any

from memgym.llm.base import BackendSpecError
from memgym.memory_bank.schema import Session

CACHE_FORMAT = "memgym-stages-v2"
"""Mixed into every key: raise it whenever a stage's key or cached value changes form, so that no
reader ever meets an older value."""

#: stage -> the settings fields its output depends on (their effective values, :func:`stage_settings`)
STAGE_SETTINGS: dict[str, tuple[str, ...]] = {
    "extract": ("extractor", "task_model", "extract_max_new_tokens", "extractor_max_new_tokens",
                "extractor_context_tokens", "extractor_segment_tokens", "constrained", "constrained_max_chars",
                "constrained_max_items"),
    "index": ("program_llm_calls", "task_model"),
    "plan": ("plan_mode", "task_model", "plan_max_new_tokens", "constrained", "constrained_max_chars",
             "constrained_max_items"),
    "retrieve": (),
    "answer": ("task_model", "answer_max_new_tokens", "dataset"),
    "score": ("scorer", "judge_model", "dataset", "judge_protocol", "judge_constrained"),
}

_SELECTION = "chooses which conversations and questions run; every key hashes the session and question text"
_TRANSPORT = "how a model is reached, not what it answers (greedy decoding; the response cache keys on the request)"
#: settings field -> why no stage's output depends on it
KEY_NEUTRAL: dict[str, str] = {
    "path": _SELECTION, "beam_full_chat": _SELECTION, "beam_keep_markers": _SELECTION, "n_sessions": _SELECTION,
    "max_questions": _SELECTION,
    "batch_size": _TRANSPORT, "cache": _TRANSPORT, "request_timeout_s": _TRANSPORT, "request_retries": _TRANSPORT,
    "diagnostics": "adds evidence-probe retrieves, each keyed by its own query",
    "call_timeout_s": "a call that times out fails its conversation's run, and nothing of a failed call is cached",
    "workers": "conversations run concurrently, each through the same keys",
    "progress": "progress bars only",
    "context_tokens": "the answer and score keys hash the budget-cut text itself",
    "context_tokenizer": "the answer and score keys hash the budget-cut text itself",
}


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


def open_stage_cache(spec: str | None) -> StageCache:
    """``None`` → ``$MEMGYM_CACHE/stages.sqlite``; ``"none"`` → in memory only, without index
    snapshots (one evaluation never reads its own back); else a path."""
    if spec == "none":
        return StageCache(snapshots=False)
    if spec is None:
        from memgym.llm.paths import cache_dir
        return StageCache(cache_dir() / "stages.sqlite")
    return StageCache(spec)


# --------------------------------------------------------------------------- cache identities


def spec_identity(spec: str) -> str:
    """A cache identity for a model or extractor spec: ``spec@<dir fingerprint>`` for local
    ``hf:``/``vllm:`` dirs (retraining in place changes it), ``expert:<file sha>,...`` for an
    expert replay (its files' bytes), the spec itself otherwise."""
    from memgym.data_synth.extractors import expert_paths
    from memgym.llm.paths import dir_fingerprint
    from memgym.llm.specs import parse_spec, resolve_model_path

    if spec.startswith("expert:"):
        return "expert:" + ",".join(file_sha(p) for p in expert_paths(spec))
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


def stage_settings(stage: str, s, identity: Callable[[str], str] = spec_identity) -> dict:
    """The effective values of ``STAGE_SETTINGS[stage]`` under ``s`` (a
    :class:`~memgym.evolution.execution.settings.RunnerSettings`): a field that does not apply under
    the current modes is None; model and extractor specs enter as ``identity(spec)``."""
    bounds = [s.constrained_max_chars, s.constrained_max_items]
    if stage == "extract":
        mode = s.extraction_mode
        model = mode not in ("instruction", "turns", "expert")
        return {"mode": mode,
                "extractor": identity(s.extractor) if mode not in ("instruction", "turns") else None,
                "task": identity(s.task_model) if mode == "instruction" else None,
                "max_new_tokens": (s.extract_max_new_tokens if mode == "instruction"
                                   else s.extractor_max_new_tokens if model else None),
                "context_tokens": s.extractor_context_tokens if model else None,
                "segment_tokens": s.extractor_segment_tokens if model else None,
                "constrained": bounds if s.constrained and (mode == "instruction" or model) else None}
    if stage == "index":
        return {"program_llm_calls": s.program_llm_calls,
                "task": identity(s.task_model) if s.program_llm_calls else None}
    if stage == "plan":
        llm = s.plan_mode == "llm"
        return {"mode": s.plan_mode, "task": identity(s.task_model) if llm else None,
                "max_new_tokens": s.plan_max_new_tokens if llm else None,
                "constrained": bounds if llm and s.constrained else None}
    if stage == "retrieve":
        return {}
    if stage == "answer":
        return {"task": identity(s.task_model), "max_new_tokens": s.answer_tokens}
    if stage == "score":
        if s.scorer != "llm":
            return {"scorer": s.scorer}
        from memgym.rewards.scoring.judge_protocols import protocol_identity
        return {"scorer": "llm", "judge": identity(s.judge_model) if s.judge_model else None, "dataset": s.dataset,
                "protocol": protocol_identity(s.dataset, s.judge_protocol), "constrained": s.judge_constrained}
    raise KeyError(stage)
