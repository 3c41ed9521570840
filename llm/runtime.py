"""Shared model runtime of a run: one backend per spec (shared across roles), the response cache,
the embedder, and per-role accounting of model calls and tokens (cache hits cost nothing)."""
from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from memgym.llm.base import Backend, GenerationParams


class RoleBackend:
    """Wraps a backend for one role and books its real calls and tokens to that role (and, under
    ``tokens[role]["estimated"]``, how many of those calls' counts are estimates)."""

    def __init__(self, inner: Backend, role: str, ledger: "Runtime"):
        self.inner, self.role, self.ledger = inner, role, ledger
        self.model_id = inner.model_id

    @property
    def calls(self) -> int:
        return self.ledger.calls[self.role]

    @property
    def tokenizer(self):
        return getattr(self.inner, "tokenizer", None)

    def generate(self, batch, params: GenerationParams, schemas=None):
        """The inner backend's completions (``schemas`` passed on only when some entry is set)."""
        if schemas is not None and any(s is not None for s in schemas):
            out = self.inner.generate(batch, params, schemas=schemas)
        else:
            out = self.inner.generate(batch, params)
        for c in out:
            if not c.cached:
                t = self.ledger.tokens[self.role]
                self.ledger.calls[self.role] += 1
                t["prompt"] += c.prompt_tokens
                t["completion"] += c.completion_tokens
                if c.estimated:  # the server's counts were missing or invalid (memgym.llm.base.Completion)
                    t["estimated"] = t.get("estimated", 0) + 1
        return out

    def forget(self, batch, params: GenerationParams, schemas=None) -> None:
        """:meth:`memgym.llm.cache.CachedBackend.forget` where the inner backend caches, else a no-op."""
        forget = getattr(self.inner, "forget", None)
        if callable(forget):
            forget(batch, params, schemas)


class Runtime:
    """Holds the backends of a run. ``backend(spec, role)`` loads each spec once."""

    def __init__(self, cache=None, embedder=None, batch_size: int = 8, embedding_cache=None,
                 request_timeout_s: float | None = None, request_retries: int | None = None):
        self.cache = cache
        # openai: backends only (None: memgym.llm.openai_backend.request_settings)
        self.request_options = {k: v for k, v in (("timeout_s", request_timeout_s), ("max_retries", request_retries))
                                if v is not None}
        self._embedder = embedder
        self._embedding_cache = embedding_cache
        self.batch_size = batch_size
        self._backends: dict[str, Backend] = {}
        self.calls: dict[str, int] = defaultdict(int)
        self.tokens: dict[str, dict[str, int]] = defaultdict(lambda: {"prompt": 0, "completion": 0})

    @classmethod
    def from_config(cls, cache: str | None = None, batch_size: int = 8, request_timeout_s: float | None = None,
                    request_retries: int | None = None) -> "Runtime":
        """``cache``: sqlite path, None for ``$MEMGYM_CACHE/responses.sqlite``, ``"none"`` for no
        response cache. ``request_*``: of ``openai:`` backends. Both caches open here, before any
        model loads (:class:`memgym.llm.cache.CacheCorruptError`)."""
        from memgym.llm.cache import ResponseCache
        from memgym.llm.embeddings import EmbeddingCache
        from memgym.llm.paths import cache_dir

        rc = None
        if cache != "none":
            rc = ResponseCache(Path(cache) if cache else cache_dir() / "responses.sqlite")
        return cls(cache=rc, batch_size=batch_size, embedding_cache=EmbeddingCache(cache_dir() / "embeddings.sqlite"),
                   request_timeout_s=request_timeout_s, request_retries=request_retries)

    @property
    def embedder(self):
        if self._embedder is None:
            from memgym.llm.embeddings import load_embedder

            self._embedder = load_embedder("minilm", cache=self._embedding_cache)
        return self._embedder

    def backend(self, spec: str, role: str, **load_kw) -> RoleBackend:
        """The backend of ``spec`` for ``role``, loaded once (``load_kw`` applies to the first load)."""

        if spec not in self._backends:
            from memgym.llm.specs import load_backend, parse_spec

            load_kw.setdefault("batch_size", self.batch_size)
            if parse_spec(spec).kind == "openai":
                for k, v in self.request_options.items():
                    load_kw.setdefault(k, v)
            self._backends[spec] = load_backend(spec, cache=self.cache, **load_kw)
        return RoleBackend(self._backends[spec], role, self)

    def register(self, spec: str, backend: Backend) -> None:
        """Use an already-built backend for ``spec`` (tests, in-process models)."""
        self._backends[spec] = backend

    def loaded_specs(self) -> list[str]:
        """The specs whose backends this runtime has loaded (or was given), in loading order."""
        return list(self._backends)

    def loaded_embedder(self):
        """The embedder, when one was loaded or given (None: no stage embedded anything)."""
        return self._embedder

    def calls_snapshot(self) -> dict:
        emb = self._embedder.calls if self._embedder is not None else 0
        return {"calls": dict(self.calls), "tokens": {k: dict(v) for k, v in self.tokens.items()}, "embed": emb}

    def calls_since(self, snap: dict) -> dict:
        """Calls and tokens per role since ``snap`` (plus ``embed`` batches)."""
        now = self.calls_snapshot()
        calls = {r: now["calls"].get(r, 0) - snap["calls"].get(r, 0) for r in now["calls"]}
        calls["embed"] = now["embed"] - snap["embed"]
        tokens = {r: {k: v - snap["tokens"].get(r, {}).get(k, 0) for k, v in t.items()}
                  for r, t in now["tokens"].items()}
        return {"calls": calls, "tokens": tokens}
