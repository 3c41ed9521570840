"""``memgym bench retrieval``: top-k retrieval ms/query of VectorIndex and BankRetriever as
ratios to a numpy floor measured in the same run."""
from __future__ import annotations

import json
import time

import numpy as np


def _time_per_call(fn, reps: int) -> float:
    fn()  # warm-up
    t = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - t) / reps


class _LookupEmbedder:
    """Returns precomputed vectors for known texts (so the bench times retrieval, not MiniLM)."""

    def __init__(self, table: dict[str, np.ndarray], dim: int):
        self.table, self.dim, self.calls = table, dim, 0

    def encode(self, texts):
        return np.stack([self.table[t] for t in texts])


def bench_retrieval(sizes=(1_000, 10_000, 100_000), dim: int = 384, k: int = 10, queries: int = 64,
                    seed: int = 0) -> list[dict]:
    """Top-``k`` retrieval over ``n`` normalised ``dim``-d entries, ms per query, for
    (a) the numpy floor: one matmul + argpartition (unsorted top-k),
    (b) :class:`VectorIndex.search` (top-k sorted), and
    (c) :class:`BankRetriever.retrieve` over a real :class:`MemoryBank` (sorted top-k plus the
        per-part counts and rendered entries), with embeddings looked up, not computed.
    Ratios are to the floor measured in the same run: 7 interleaved rounds, median of each."""
    from memory_bank.bank import Entry, MemoryBank
    from memory_bank.retrieval import BankRetriever, VectorIndex

    rng = np.random.default_rng(seed)
    rows = []
    for n in sizes:
        mat = rng.normal(size=(n, dim)).astype(np.float32)
        mat /= np.linalg.norm(mat, axis=1, keepdims=True)
        q = rng.normal(size=(queries, dim)).astype(np.float32)
        q /= np.linalg.norm(q, axis=1, keepdims=True)
        reps = max(10, int(3e7 / (n * dim)))

        def floor_one(i=[0]):
            v = q[i[0] % queries]
            i[0] += 1
            s = mat @ v
            return np.argpartition(-s, k - 1)[:k]

        idx = VectorIndex(dim)
        idx.add(mat)

        def ours_one(i=[0]):
            v = q[i[0] % queries]
            i[0] += 1
            return idx.search(v, k)

        bank = MemoryBank()
        parts = ("episodic", "semantic", "procedural")
        table = {}
        for j in range(n):
            p = parts[j % 3]
            eid = f"{p[0].upper()}{j + 1}"
            text = f"entry {j}"
            bank.parts[p][eid] = Entry(eid, text, 1, 1)
            table[text] = mat[j]
        qtexts = [f"question {j}" for j in range(queries)]
        table.update({t: q[j] for j, t in enumerate(qtexts)})
        retriever = BankRetriever(bank, _LookupEmbedder(table, dim), k=k)

        def bank_one(i=[0]):
            t = qtexts[i[0] % queries]
            i[0] += 1
            return retriever.retrieve([t])

        # Interleave the three in rounds and keep each one's median round, so a burst of load
        # from another process hits all three alike instead of skewing one ratio.
        rounds = {"floor": [], "ours": [], "bank": []}
        for _ in range(7):
            rounds["floor"].append(_time_per_call(floor_one, reps))
            rounds["ours"].append(_time_per_call(ours_one, reps))
            rounds["bank"].append(_time_per_call(bank_one, reps))
        t_floor, t_ours, t_bank = (float(np.median(rounds[k])) for k in ("floor", "ours", "bank"))
        rows.append({"entries": n, "dim": dim, "k": k, "reps": reps,
                     "floor_ms": round(1e3 * t_floor, 4), "vector_index_ms": round(1e3 * t_ours, 4),
                     "bank_retriever_ms": round(1e3 * t_bank, 4),
                     "vector_index_ratio": round(t_ours / t_floor, 3),
                     "bank_retriever_ratio": round(t_bank / t_floor, 3)})
    return rows


MAX_ENTRIES = 5_000_000
COPIES = 3  # the float32 bank is held about three times (floor matrix, VectorIndex, BankRetriever)


def _retrieval(args) -> int:
    from launch.bench.args import physical_memory_bytes
    from llm.errors import ConfigError

    if args.k > min(args.sizes):
        raise ConfigError(f"--k {args.k} is larger than the smallest --sizes entry {min(args.sizes)}")
    need, have = COPIES * 4 * max(args.sizes) * args.dim, physical_memory_bytes()
    if have and need > have // 2:
        raise ConfigError(f"--sizes {max(args.sizes):,} x --dim {args.dim} needs about {need / 2**30:.1f} GiB, more "
                          f"than half of this machine's {have / 2**30:.1f} GiB: use smaller sizes")
    rows = bench_retrieval(tuple(args.sizes), args.dim, args.k)
    print("| entries | floor ms/query | VectorIndex ms/query (ratio) | BankRetriever ms/query (ratio) |")
    print("|---|---|---|---|")
    for r in rows:
        print(f"| {r['entries']:,} | {r['floor_ms']:.3f} | {r['vector_index_ms']:.3f} ({r['vector_index_ratio']:.2f}x)"
              f" | {r['bank_retriever_ms']:.3f} ({r['bank_retriever_ratio']:.2f}x) |")
    print(json.dumps(rows))
    return 0


def register_bench(s) -> None:
    """Add ``retrieval`` to the ``memgym bench`` subcommands."""
    r = s.add_parser("retrieval", help="top-k retrieval ms/query vs a numpy matmul+argpartition floor",
                     description="Top-10 retrieval over 1K/10K/100K entries of 384 dims: ms/query of "
                                 "VectorIndex and BankRetriever, each as a ratio to the numpy floor.")
    from launch.bench.args import int_range

    r.add_argument("--sizes", type=int_range(1, MAX_ENTRIES), nargs="+", default=[1_000, 10_000, 100_000],
                   help=f"bank sizes in entries, 1..{MAX_ENTRIES:,} (default 1000 10000 100000)")
    r.add_argument("--dim", type=int_range(1, 8192), default=384, help="embedding dimension, 1..8192 (default 384)")
    r.add_argument("--k", type=int_range(1), default=10, help="entries retrieved per query (default 10)")
    r.set_defaults(func=_retrieval)
