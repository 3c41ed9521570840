"""The toolkit a memory program gets in ``Memory.__init__`` (the task LLM and the embedder behind
call budgets and argument limits, plus pure helpers; PrisMem's memory interface,
arXiv 2610.06361) and the adapter from memgym's backends to its host."""
from __future__ import annotations

from contextlib import AbstractContextManager, nullcontext
from typing import Any, Protocol, runtime_checkable

import numpy as np

from memgym.memory_bank.errors import BudgetExceededError, ToolkitError
from memgym.memory_bank.contract.contract import OUT_CHAR_BUDGET


@runtime_checkable
class ToolkitHost(Protocol):
    """What serves a program's toolkit calls (proxied in the sandbox): ``embed(texts)`` -> (n, dim)
        L2-normalised rows; ``llm(prompt, max_tokens)`` -> the task LLM's completion text.
        """

    def embed(self, texts: list[str]) -> Any: ...

    def llm(self, prompt: str, max_tokens: int) -> str: ...


class BackendToolkitHost:
    """The adapter from an ``memgym.llm.base`` Backend + Embedder to :class:`ToolkitHost`. ``backend`` /
        ``embedder``: the objects or zero-argument callables resolved on first use; ``lock``: a context
        manager held around every model call (default none). ``llm`` sends one user message, greedy.
        """

    def __init__(self, backend, embedder, *, lock: AbstractContextManager | None = None):
        self._backend, self._embedder = backend, embedder
        self._lock = lock if lock is not None else nullcontext()

    @staticmethod
    def _get(x):
        return x() if callable(x) and not hasattr(x, "generate") and not hasattr(x, "encode") else x

    def embed(self, texts: list[str]) -> np.ndarray:
        with self._lock:
            return self._get(self._embedder).encode(list(texts))

    def llm(self, prompt: str, max_tokens: int) -> str:
        from memgym.llm.base import GenerationParams

        params = GenerationParams(max_new_tokens=max_tokens)
        with self._lock:
            return self._get(self._backend).generate([[{"role": "user", "content": prompt}]], params)[0].text


def unit_rows(arr: np.ndarray) -> np.ndarray:
    """``arr`` (n, dim) float32 with each nonzero row divided by its L2 norm (zero rows kept):
    the vectors a program's ``toolkit.embed`` returns, and those
    :class:`memgym.memory_bank.retrieval.BankRetriever` ranks with, so the two agree to the bit."""
    norms = np.linalg.norm(arr, axis=1, keepdims=True)
    return arr / np.where(norms > 0, norms, 1.0)


class Toolkit:
    """What a memory program may use inside ``Memory``: ``embed(texts)`` (n, dim) normalised
        vectors; ``llm(prompt, max_tokens=256)`` spending one unit of ``budget``
        (:class:`BudgetExceededError` past it); ``embed_budget`` (None: no cap); :meth:`cosine_topk`,
        :meth:`truncate`, ``OUT_CHAR_BUDGET``. Argument limits (``max_embed_texts``,
        ``max_text_chars``, ``max_llm_tokens``) raise :class:`ToolkitError`. ``calls`` counts
        {"llm", "embed", "embed_texts", "refused"}.
        """

    OUT_CHAR_BUDGET = OUT_CHAR_BUDGET

    def __init__(self, host: ToolkitHost, *, llm_budget: int = 0, embed_budget: int | None = None,
                 max_embed_texts: int = 4096, max_text_chars: int = 100_000, max_llm_tokens: int = 2048):
        self._host = host
        self._llm_left = int(llm_budget)
        self._embed_left = None if embed_budget is None else int(embed_budget)
        self.max_embed_texts, self.max_text_chars, self.max_llm_tokens = max_embed_texts, max_text_chars, max_llm_tokens
        self.calls = {"llm": 0, "embed": 0, "embed_texts": 0, "refused": 0}

    budget = property(lambda self: self._llm_left, doc="Remaining llm calls (int >= 0).")
    embed_budget = property(lambda self: self._embed_left, doc="Remaining embed calls, or None = no cap.")

    def _check_texts(self, texts: Any) -> list[str]:
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise ToolkitError(f"embed(texts) needs a list of str, got {type(texts).__name__}")
        if len(texts) > self.max_embed_texts:
            raise ToolkitError(f"embed: {len(texts)} texts > max {self.max_embed_texts} per call")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ToolkitError(f"embed: texts[{i}] is {type(t).__name__}, not str")
            if len(t) > self.max_text_chars:
                raise ToolkitError(f"embed: texts[{i}] has {len(t)} chars > max {self.max_text_chars}")
        return list(texts)

    def embed_array(self, texts: list[str]) -> np.ndarray:
        """Like :meth:`embed` but returns a float32 array (n, dim). Host output that is not
        (n, dim) finite numbers raises :class:`ToolkitError`; rows are re-normalised."""
        texts = self._check_texts(texts)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if self._embed_left is not None and self._embed_left <= 0:
            self.calls["refused"] += 1
            raise BudgetExceededError("embed call budget exhausted", "embed")
        arr = np.asarray(self._host.embed(texts), dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] != len(texts) or not np.isfinite(arr).all():
            raise ToolkitError(f"embedder returned shape {arr.shape} for {len(texts)} texts (or non-finite values)")
        arr = unit_rows(arr)
        if self._embed_left is not None:
            self._embed_left -= 1
        self.calls["embed"] += 1
        self.calls["embed_texts"] += len(texts)
        return arr

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Embed ``texts``: a list of L2-normalised vectors (n × dim floats); [] for []."""
        return self.embed_array(texts).tolist()

    def llm(self, prompt: str, max_tokens: int = 256) -> str:
        """One task-LLM completion of ``prompt`` (at most ``max_tokens`` tokens)."""
        if not isinstance(prompt, str):
            raise ToolkitError(f"llm(prompt) needs a str, got {type(prompt).__name__}")
        if len(prompt) > self.max_text_chars:
            raise ToolkitError(f"llm: prompt has {len(prompt)} chars > max {self.max_text_chars}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= self.max_llm_tokens:
            raise ToolkitError(f"llm: max_tokens must be an int in [1, {self.max_llm_tokens}], got {max_tokens!r}")
        if self._llm_left <= 0:
            self.calls["refused"] += 1
            raise BudgetExceededError("llm call budget exhausted", "llm")
        out = self._host.llm(prompt, max_tokens)
        if not isinstance(out, str):
            raise ToolkitError(f"llm host returned {type(out).__name__}, not str")
        self._llm_left -= 1
        self.calls["llm"] += 1
        return out

    @staticmethod
    def cosine_topk(query_vec: Any, matrix: Any, k: int) -> list[tuple[int, float]]:
        """``[(row, cosine), ...]``: the top ``min(k, n)`` rows of ``matrix`` (n, dim) by cosine with
                ``query_vec``, best first (ties: lower index; zero vectors score 0). :class:`ToolkitError`
                for a dimension mismatch.
                """
        q = np.asarray(query_vec, dtype=np.float32).reshape(-1)
        m = np.asarray(matrix, dtype=np.float32)
        if m.size == 0 or k <= 0:
            return []
        if m.ndim != 2 or m.shape[1] != q.shape[0]:
            raise ToolkitError(f"cosine_topk: matrix shape {m.shape} does not match query dim {q.shape[0]}")
        denom = np.linalg.norm(m, axis=1) * (np.linalg.norm(q) or 1.0)
        sims = (m @ q) / np.where(denom > 0, denom, 1.0)
        order = np.argsort(-sims, kind="stable")[:k]
        return [(int(i), float(np.clip(sims[i], -1.0, 1.0))) for i in order]

    @staticmethod
    def truncate(text: str, limit: int = OUT_CHAR_BUDGET) -> str:
        """``text`` cut to at most ``limit`` characters."""
        return text[:limit]
