"""Sentence embedders: sentence-transformers (default all-MiniLM-L6-v2) with a text-hash-keyed
cache, and a model-free :class:`HashEmbedder` for tests and stub runs."""
from __future__ import annotations

import contextlib
import hashlib
import os
import re
import sqlite3
import threading
from pathlib import Path

import numpy as np

from memgym.llm.cache import SqliteCache
from memgym.llm.paths import dir_fingerprint


def _check_texts(texts) -> list[str]:
    if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
        raise TypeError(f"encode() takes a list of str, got {type(texts).__name__}")
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"encode(): texts[{i}] must be a str, got {type(t).__name__}")
    return list(texts)


def embedding_key(model_id: str, text: str) -> str:
    """sha256 hex of ``model_id + "\\x00" + text`` (UTF-8)."""
    return hashlib.sha256(f"{model_id}\x00{text}".encode("utf-8")).hexdigest()


class EmbeddingCache(SqliteCache):
    """Thread-safe map from :func:`embedding_key` to a float32 vector, in memory plus optional
    sqlite at ``path``. A stored vector of the wrong ``dim`` is a miss. A corrupt file raises
    :class:`memgym.llm.cache.CacheCorruptError` at open; one that breaks mid-run is dropped with a warning."""

    TABLE, WHAT = "embeddings", "embedding"
    SCHEMA = "CREATE TABLE IF NOT EXISTS embeddings (key TEXT PRIMARY KEY, dim INTEGER NOT NULL, vec BLOB NOT NULL)"
    WITHOUT = "after moving it (it is rebuilt as texts are embedded)"

    def __init__(self, path: str | Path | None = None):
        self._mem: dict[str, np.ndarray] = {}
        if path is not None:
            super().__init__(path)
        else:
            self.path, self._lock, self._broken, self._conn = None, threading.Lock(), None, None

    def get_many(self, keys: list[str], dim: int) -> dict[str, np.ndarray]:
        """The stored vectors (shape (dim,), float32) for those of ``keys`` that are present."""
        out: dict[str, np.ndarray] = {}
        with self._lock:
            rest = []
            for k in dict.fromkeys(keys):
                v = self._mem.get(k)
                if v is not None and v.shape == (dim,):
                    out[k] = v
                else:
                    rest.append(k)
            if self._conn is not None and rest:
                try:
                    for k, d, blob in self._select("key, dim, vec", rest):
                        if d == dim and len(blob) == 4 * dim:
                            v = np.frombuffer(blob, dtype=np.float32).copy()
                            self._mem[k] = out[k] = v
                except sqlite3.DatabaseError as e:
                    self._broke(e)
        return out

    def _broke(self, err: Exception) -> None:
        """The file broke mid-run: warn once, keep only the in-memory part, go on."""
        super()._broke(err)
        try:
            self._conn.close()
        finally:
            self._conn = None

    def put_many(self, items: dict[str, np.ndarray]) -> None:
        """Store vectors (each 1-D, cast to float32) in memory and, if persistent, on disk."""
        vecs = {k: np.ascontiguousarray(v, dtype=np.float32).reshape(-1) for k, v in items.items()}
        self._write("INSERT OR REPLACE INTO embeddings VALUES (?, ?, ?)",
                    [(k, v.shape[0], v.tobytes()) for k, v in vecs.items()])
        with self._lock:
            self._mem.update(vecs)

    def __len__(self) -> int:
        with self._lock:
            return len(self._mem) if self._conn is None else self._count()

    def close(self) -> None:
        """Close the sqlite connection (the in-memory part stays usable)."""
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


BATCH_ENV = "MEMGYM_EMBED_BATCH"
THREADS_ENV = "MEMGYM_EMBED_THREADS"
DEFAULT_BATCH = 8  # mini-batch of the forward pass (less padding, cache-resident activations on CPU)


def _env_int(name: str, default: int | None) -> int | None:
    """``$name`` as an int >= 1 when set and non-empty, else ``default``; ``ValueError`` names the variable."""
    raw = os.environ.get(name, "").strip()
    if not raw:
        return default
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ValueError(f"${name} must be an integer >= 1, got {raw!r}")
    return value


class STEmbedder:
    """A sentence-transformers :class:`memgym.llm.base.Embedder` over a local model dir (default
    :func:`memgym.llm.models.minilm_dir`: dim 384, texts truncated at 256 word pieces).

    Only texts missing from ``cache`` reach the model, de-duplicated, in one encode call
    (``calls`` counts them) in mini-batches of ``batch_size`` (default ``$MEMGYM_EMBED_BATCH`` or
    8) on ``threads`` torch threads (default ``$MEMGYM_EMBED_THREADS``, else unchanged).
    ``model_id`` = ``st:<dir>@<fingerprint>`` keys the cache. Raises TypeError for non-str
    input, FileNotFoundError for a missing dir, ValueError for a batch size or threads < 1.
    """

    def __init__(self, model_dir: str | Path | None = None, batch_size: int | None = None,
                 cache: EmbeddingCache | None = None, device: str = "cpu", progress: bool = False,
                 threads: int | None = None):
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from sentence_transformers import SentenceTransformer

        from memgym.llm.models import minilm_dir

        path = Path(model_dir) if model_dir is not None else minilm_dir()
        if not path.is_dir():
            raise FileNotFoundError(f"STEmbedder: model dir {path} does not exist")
        batch_size = _env_int(BATCH_ENV, DEFAULT_BATCH) if batch_size is None else batch_size
        threads = _env_int(THREADS_ENV, None) if threads is None else threads
        if batch_size < 1:
            raise ValueError(f"STEmbedder batch_size must be >= 1, got {batch_size}")
        if threads is not None and threads < 1:
            raise ValueError(f"STEmbedder threads must be >= 1, got {threads}")
        self.model = SentenceTransformer(str(path), device=device, local_files_only=True)
        self.path = path
        self.dim = int(self.model.get_embedding_dimension())
        self.model_id = f"st:{path.parent.name}/{path.name}@{dir_fingerprint(path)}"
        self.batch_size = batch_size
        self.threads = threads
        self.cache = cache
        self.progress = progress
        self.calls = 0

    def encode(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts``: float32 array (len(texts), dim), each row of L2 norm 1."""
        texts = _check_texts(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        if not texts:
            return out
        keys = [embedding_key(self.model_id, t) for t in texts]
        found = self.cache.get_many(keys, self.dim) if self.cache is not None else {}
        todo = list(dict.fromkeys(t for t, k in zip(texts, keys) if k not in found))
        if todo:
            with _torch_threads(self.threads):
                vecs = self.model.encode(todo, batch_size=self.batch_size, convert_to_numpy=True,
                                         normalize_embeddings=True, show_progress_bar=self.progress)
            self.calls += 1
            fresh = {embedding_key(self.model_id, t): np.asarray(v, dtype=np.float32) for t, v in zip(todo, vecs)}
            if self.cache is not None:
                self.cache.put_many(fresh)
            found = {**found, **fresh}
        for i, k in enumerate(keys):
            out[i] = found[k]
        return out


@contextlib.contextmanager
def _torch_threads(n: int | None):
    """``torch.set_num_threads(n)`` for the block, then the previous count (no-op for None)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


_TOKEN = re.compile(r"\w+", re.UNICODE)


class HashEmbedder:
    """A deterministic, model-free :class:`memgym.llm.base.Embedder` for tests and stub runs only.

    Unsigned hashing trick (Weinberger et al. 2009, "Feature Hashing for Large Scale Multitask
    Learning"): each lower-cased ``\\w+`` token (none: the empty token) adds 1 to bucket
    ``blake2b(token) mod dim``; rows L2-normalised. ``calls`` counts non-empty ``encode`` calls.
    """

    def __init__(self, dim: int = 64):
        if dim < 1:
            raise ValueError(f"HashEmbedder dim must be >= 1, got {dim}")
        self.dim = dim
        self.model_id = f"hash-{dim}"
        self.calls = 0
        self._buckets: dict[str, int] = {}

    def _bucket(self, token: str) -> int:
        b = self._buckets.get(token)
        if b is None:
            b = self._buckets[token] = int.from_bytes(hashlib.blake2b(token.encode("utf-8"), digest_size=8).digest(),
                                                      "little") % self.dim
        return b

    def encode(self, texts: list[str]) -> np.ndarray:
        """float32 array (len(texts), dim) of L2-normalised hashed token counts."""
        texts = _check_texts(texts)
        out = np.zeros((len(texts), self.dim), dtype=np.float32)
        for i, t in enumerate(texts):
            tokens = _TOKEN.findall(t.lower()) or [""]
            for tok in tokens:
                out[i, self._bucket(tok)] += 1.0
        if texts:
            self.calls += 1
            out /= np.linalg.norm(out, axis=1, keepdims=True)
        return out


#: The embedder vocabulary, the same for every command and recipe (``embedder:`` / ``--embedder``).
EMBEDDER_HELP = ("minilm (the embedded all-MiniLM-L6-v2) | hash:<dim> (model-free bag of words: tests and stub runs "
                 "only) | none (no ranking) | a sentence-transformers model dir")


def check_embedder_spec(spec: str, *, allow_none: bool = True) -> str:
    """``spec`` unchanged when in :data:`EMBEDDER_HELP`'s vocabulary (a model dir must exist), else
    ValueError; ``none`` too when ``allow_none`` is False. Loads nothing."""
    if spec == "none" and not allow_none:
        raise ValueError("embedder 'none' is not possible here: this step ranks by vectors (minilm, hash:<dim> or a "
                         "model dir)")
    if spec in ("minilm", "none"):
        return spec
    if spec == "hash" or spec.startswith("hash:"):
        if spec[5:].isdigit() and int(spec[5:]) >= 1:
            return spec
        raise ValueError(f"embedder {spec!r}: the hash embedder is written hash:<dim>, dim >= 1 (e.g. hash:64)")
    if not spec or not Path(spec).is_dir():
        raise ValueError(f"embedder {spec!r} is not one of: {EMBEDDER_HELP} (no such directory)")
    return spec


def load_embedder(spec: str, cache: EmbeddingCache | None = None):
    """The embedder for ``spec`` (:func:`check_embedder_spec`): ``minilm`` or a model dir ->
    :class:`STEmbedder` (``cache`` default ``$MEMGYM_CACHE/embeddings.sqlite``); ``hash:<dim>``
    -> :class:`HashEmbedder`; ``none`` -> None."""

    check_embedder_spec(spec)
    if spec == "none":
        return None
    if spec.startswith("hash:"):
        return HashEmbedder(int(spec[5:]))
    from memgym.llm.paths import cache_dir

    return STEmbedder(None if spec == "minilm" else spec, cache=cache or EmbeddingCache(cache_dir() / "embeddings.sqlite"))
