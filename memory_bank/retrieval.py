"""Retrieval for QA: top-k entries over episodic ∪ semantic ∪ procedural plus the core block,
with per-part counts (MemBuilder §3.3, k = 10). Scores are cosines in [-1, 1].
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memgym.memory_bank.actions import PARTS
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.contract.toolkit import unit_rows

DEFAULT_K = 10


def program_vectors(vectors) -> np.ndarray:
    """``vectors`` (n, dim) as a program's ``toolkit.embed`` hands them over (float32, normalised
    twice), so :class:`BankRetriever` and ``memory_bank/programs/bank.py`` rank identically.
    """
    return unit_rows(unit_rows(np.asarray(vectors, dtype=np.float32)))


class VectorIndex:
    """Append-only matrix of normalised vectors with exact top-k by inner product; each query is
    scored alone in float64 (O(n·d)), so rankings do not depend on batching.
    """

    def __init__(self, dim: int):
        self.dim = dim
        self._mat = np.zeros((0, dim), dtype=np.float32)
        self._n = 0

    def __len__(self) -> int:
        return self._n

    def add(self, vectors: np.ndarray) -> None:
        """Append rows. ``vectors``: (m, dim) float32. Raises ValueError on a wrong shape."""
        v = np.asarray(vectors, dtype=np.float32)
        if v.ndim != 2 or v.shape[1] != self.dim:
            raise ValueError(f"VectorIndex.add expects shape (m, {self.dim}), got {v.shape}")
        need = self._n + len(v)
        if need > len(self._mat):
            grown = np.zeros((max(need, 2 * len(self._mat), 64), self.dim), dtype=np.float32)
            grown[: self._n] = self._mat[: self._n]
            self._mat = grown
        self._mat[self._n: need] = v
        self._n = need

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Top-``k`` rows per query. ``queries``: (q, dim). Returns ``(indices, scores)``, both
        (q, min(k, n)), best first."""
        q = np.asarray(queries, dtype=np.float32)
        if q.ndim == 1:
            q = q[None, :]
        k = min(k, self._n)
        if k <= 0:
            return np.zeros((len(q), 0), dtype=np.int64), np.zeros((len(q), 0), dtype=np.float32)
        mat = self._mat[: self._n].astype(np.float64)
        sims = np.stack([mat @ row for row in q.astype(np.float64)])  # (q, n), one GEMV per query
        if k < self._n:
            part = np.argpartition(-sims, k - 1, axis=1)[:, :k]
        else:
            part = np.tile(np.arange(self._n), (len(q), 1))
        top_scores = np.take_along_axis(sims, part, axis=1)
        order = np.argsort(-top_scores, axis=1, kind="stable")
        idx = np.take_along_axis(part, order, axis=1)
        return idx, np.take_along_axis(top_scores, order, axis=1).astype(np.float32)


@dataclass
class Retrieved:
    """What one question retrieved: the core block, the entries ``(part, id, text, score)``
    best first, and ``counts`` of entries per part (episodic/semantic/procedural)."""

    core: str
    entries: list[tuple[str, str, str, float]] = field(default_factory=list)

    @property
    def counts(self) -> dict[str, int]:
        c = {p: 0 for p in PARTS}
        for part, *_ in self.entries:
            c[part] += 1
        return c

    def render(self) -> str:
        """The context string given to the answer model."""
        lines = []
        if self.core:
            lines += ["# Core memory", self.core, ""]
        if self.entries:
            lines.append("# Retrieved memories")
            lines += [f"[{id_}] ({part}) {text}" for part, id_, text, _ in self.entries]
        return "\n".join(lines).strip()


class BankRetriever:
    """Embeds every live entry of a bank once and answers top-k queries over it.

    ``embedder`` follows :class:`memgym.llm.base.Embedder` (use a cached one so repeated banks cost
    no model call)."""

    def __init__(self, bank: MemoryBank, embedder, k: int = DEFAULT_K):
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        self.bank, self.embedder, self.k = bank, embedder, k
        self.items = [(p, e.id, e.text) for p in PARTS for e in bank.entries(p)]
        self.index = VectorIndex(embedder.dim)
        if self.items:
            self.index.add(program_vectors(embedder.encode([t for _, _, t in self.items])))

    def retrieve(self, questions: list[str]) -> list[Retrieved]:
        """One :class:`Retrieved` per question (one batched embedding call)."""
        if not questions:
            return []
        if not self.items:
            return [Retrieved(self.bank.core) for _ in questions]
        queries = program_vectors(self.embedder.encode(list(questions)))
        idx, scores = self.index.search(queries, self.k)
        return [
            Retrieved(self.bank.core, [(*self.items[i], float(s)) for i, s in zip(row, srow)])
            for row, srow in zip(idx, scores)
        ]


def retrieve(bank: MemoryBank, questions: list[str], embedder, k: int = DEFAULT_K) -> list[Retrieved]:
    """Convenience wrapper around :class:`BankRetriever`."""
    return BankRetriever(bank, embedder, k).retrieve(questions)
