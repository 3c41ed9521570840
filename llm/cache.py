"""Persistent sqlite response cache keyed by model, messages and sampling params, the
:class:`SqliteCache` base it shares with the embedding cache, and the :class:`CachedBackend` wrapper."""
from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
import warnings
from pathlib import Path

from memgym.llm.base import Backend, Completion, GenerationParams, LLMError, Messages, check_batch
from memgym.llm.structured import JsonSchema, check_schemas


class CacheError(LLMError):
    """A sqlite cache file (responses, embeddings, stage outputs) cannot be opened."""

    kind = "cache"


class CacheCorruptError(CacheError):
    """A sqlite cache file is not a database or fails the integrity check (message: file, recovery)."""


def corrupt_message(path, what: str, err, without: str) -> str:
    return (f"the {what} cache {path} is corrupt ({err}); move it aside and rerun "
            f"(mv '{path}' '{path}.corrupt'; it only saves recomputation) or run {without}")


def open_cache_db(path: str, schema: str, what: str, without: str = "with --cache none") -> sqlite3.Connection:
    """Open (creating) a WAL sqlite cache, create its table, run ``PRAGMA quick_check``.
    ``what`` names the cache in messages, ``without`` how to run without it. Raises
    :class:`CacheCorruptError` for a corrupt file, :class:`CacheError` when it cannot be opened."""
    conn = None
    try:
        conn = sqlite3.connect(path, check_same_thread=False, timeout=30.0, isolation_level=None)
        if path != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute(schema)
        if path != ":memory:":
            verdict = conn.execute("PRAGMA quick_check").fetchone()[0]
            if verdict != "ok":
                raise sqlite3.DatabaseError(f"integrity check: {verdict}")
    except sqlite3.OperationalError as e:
        if conn is not None:
            conn.close()
        raise CacheError(f"cannot open the {what} cache {path}: {e}") from None
    except sqlite3.DatabaseError as e:
        if conn is not None:
            conn.close()
        raise CacheCorruptError(corrupt_message(path, what, e, without)) from None
    return conn


def cache_key(
model_id: str, messages: Messages, params: GenerationParams, occurrence: int = 0,
              schema: JsonSchema | None = None) -> str:
    """sha256 hex of the sorted compact JSON of ``{model, messages, params[, occurrence][, schema]}``;
    ``occurrence`` (k-th copy in a sampled batch) only when > 0, ``schema`` as ``[name, digest]``."""
    payload = {"model": model_id, "messages": messages, "params": params.to_dict()}
    if occurrence:
        payload["occurrence"] = occurrence
    if schema is not None:
        payload["schema"] = [schema.name, schema.digest]
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(blob.encode("utf-8")).hexdigest()


class SqliteCache:
    """The sqlite side of a cache: table ``TABLE`` (``SCHEMA``, keyed by a ``key`` column) in a file
    (its folder made) or ``":memory:"``, WAL, shareable across processes, opened by
    :func:`open_cache_db` (messages name the ``WHAT`` cache and ``WITHOUT``); ``_lock`` guards the
    connection. A file broken mid-run: :meth:`_broke`, then writes are skipped."""

    TABLE = SCHEMA = WHAT = ""
    WITHOUT = "with --cache none"

    def __init__(self, path: str | Path):
        self.path = str(path)
        if self.path != ":memory:":
            Path(self.path).expanduser().parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._broken: str | None = None
        self._conn = open_cache_db(self.path, self.SCHEMA, self.WHAT, self.WITHOUT)

    def _select(self, columns: str, keys: list[str]):
        """Yield ``columns`` of the rows of ``keys``, 500 keys a query (under sqlite's parameter limit)."""
        for i in range(0, len(keys), 500):
            part = keys[i:i + 500]
            yield from self._conn.execute(f"SELECT {columns} FROM {self.TABLE} WHERE key IN ({','.join('?' * len(part))})", part)

    def _write(self, sql: str, rows: list) -> None:
        """``executemany(sql, rows)`` in one ``BEGIN IMMEDIATE`` transaction (rolled back on error)
        under the lock; nothing without rows or a working file."""
        if not rows:
            return
        with self._lock:
            if self._broken or self._conn is None:
                return
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                try:
                    self._conn.executemany(sql, rows)
                except BaseException:
                    self._conn.execute("ROLLBACK")
                    raise
                self._conn.execute("COMMIT")
            except sqlite3.DatabaseError as e:
                self._broke(e)

    def _broke(self, err: Exception) -> None:
        """The file broke mid-run: warn once naming it; the run goes on uncached. Re-raises an
        ``OperationalError`` that is not corruption (a lock, a full disk)."""
        if isinstance(err, sqlite3.OperationalError) and "malformed" not in str(err):
            raise err
        if not self._broken:
            self._broken = str(err)
            warnings.warn(f"{corrupt_message(self.path, self.WHAT, err, 'with --cache none')}; continuing without it",
                          stacklevel=3)

    def _count(self) -> int:
        return int(self._conn.execute(f"SELECT COUNT(*) FROM {self.TABLE}").fetchone()[0])

    def __len__(self) -> int:
        with self._lock:
            return self._count()

    def close(self) -> None:
        """Close the connection; the object is unusable afterwards."""
        with self._lock:
            self._conn.close()


class ResponseCache(SqliteCache):
    """A :class:`SqliteCache` from :func:`cache_key` to :class:`Completion`. Writes are one transaction
    each; an undecodable row is a miss (warned); blank completions are never stored."""

    TABLE, WHAT = "responses", "response"
    SCHEMA = """CREATE TABLE IF NOT EXISTS responses (
    key TEXT PRIMARY KEY, model_id TEXT NOT NULL, value TEXT NOT NULL, created REAL NOT NULL)"""

    def get_many(self, keys: list[str]) -> dict[str, Completion]:
        """The cached completions for those of ``keys`` that are present (``cached=True``)."""
        found: dict[str, Completion] = {}
        with self._lock:
            try:
                rows = [] if self._broken else list(self._select("key, value", list(dict.fromkeys(keys))))
            except sqlite3.DatabaseError as e:
                self._broke(e)
                rows = []
        for key, value in rows:
            try:
                d = json.loads(value)
                found[key] = Completion(text=d["text"], prompt_tokens=int(d["prompt_tokens"]),
                                        completion_tokens=int(d["completion_tokens"]),
                                        finish_reason=str(d["finish_reason"]), cached=True)
            except (ValueError, KeyError, TypeError) as e:
                warnings.warn(f"ResponseCache {self.path}: undecodable row {key[:12]}… ({e}); treating as a miss")
        return found

    def put_many(self, items: list[tuple[str, str, Completion]]) -> None:
        """Store ``(key, model_id, completion)`` rows (replacing; blank texts skipped)."""
        now = time.time()
        rows = [(k, m, json.dumps({"text": c.text, "prompt_tokens": c.prompt_tokens,
                                   "completion_tokens": c.completion_tokens,
                                   "finish_reason": c.finish_reason}, ensure_ascii=False), now)
                for k, m, c in items if c.text and c.text.strip()]
        self._write("INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?)", rows)

    def delete_many(self, keys: list[str]) -> None:
        """Remove the rows of ``keys`` (absent keys are ignored), in one transaction."""
        self._write("DELETE FROM responses WHERE key = ?", [(k,) for k in keys])

    def __enter__(self) -> "ResponseCache":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class CachedBackend:
    """A :class:`Backend` that answers from a :class:`ResponseCache` when it can.

    Hits return ``Completion(cached=True)``; all misses of a call go to the inner backend in one
    ``generate`` and are stored before returning. Greedy requests are always cached (duplicates
    generated once); sampled ones only with ``params.seed`` (the k-th copy in a batch has its own
    key), else they bypass the cache. Counters: ``calls`` (inner), ``hits``, ``misses``, ``bypassed``.
    """

    def __init__(self, backend: Backend, cache: ResponseCache):
        self.backend = backend
        self.cache = cache
        self.model_id = backend.model_id
        self.hits = 0
        self.misses = 0
        self.bypassed = 0

    @property
    def calls(self) -> int:
        return self.backend.calls

    @property
    def tokenizer(self):
        """The inner backend's tokenizer (AttributeError when it has none)."""
        return self.backend.tokenizer

    def count_tokens(self, text: str) -> int:
        """Delegates to the inner backend's ``count_tokens``."""
        return self.backend.count_tokens(text)

    def generate(self, batch: list[Messages], params: GenerationParams,
                 schemas: list[JsonSchema | None] | None = None) -> list[Completion]:
        """One :class:`Completion` per conversation, in order. ``schemas`` reach the inner backend
        only when some entry is set, and are part of each cache key."""
        check_batch(batch)
        schemas = check_schemas(schemas, len(batch))
        if not batch:
            return []
        constrained = any(s is not None for s in schemas)

        def inner(msgs, sch):
            return self.backend.generate(msgs, params, schemas=sch) if constrained else self.backend.generate(msgs, params)

        if not params.greedy and params.seed is None:
            self.bypassed += len(batch)
            return inner(batch, schemas)
        keys: list[str] = []
        seen: dict[str, int] = {}
        for messages, schema in zip(batch, schemas):
            base = cache_key(self.model_id, messages, params, schema=schema)
            k = seen.get(base, 0)
            seen[base] = k + 1
            keys.append(base if params.greedy or k == 0 else cache_key(self.model_id, messages, params, k, schema=schema))
        found = self.cache.get_many(keys)
        miss_keys = list(dict.fromkeys(k for k in keys if k not in found))
        self.hits += sum(1 for k in keys if k in found)
        self.misses += len(keys) - sum(1 for k in keys if k in found)
        if miss_keys:
            first = {}
            for k, messages, schema in zip(keys, batch, schemas):
                first.setdefault(k, (messages, schema))
            fresh = inner([first[k][0] for k in miss_keys], [first[k][1] for k in miss_keys])
            if len(fresh) != len(miss_keys):
                raise LLMError(f"backend {self.model_id} returned {len(fresh)} completions for {len(miss_keys)} prompts")
            self.cache.put_many([(k, self.model_id, c) for k, c in zip(miss_keys, fresh)])
            new = dict(zip(miss_keys, fresh))
        else:
            new = {}
        return [found[k] if k in found else new[k] for k in keys]

    def forget(self, batch: list[Messages], params: GenerationParams,
               schemas: list[JsonSchema | None] | None = None) -> None:
        """Drop the cached (first-copy) responses of these requests so they are asked again."""

        schemas = check_schemas(schemas, len(batch))
        self.cache.delete_many([cache_key(self.model_id, m, params, schema=s) for m, s in zip(batch, schemas)])
