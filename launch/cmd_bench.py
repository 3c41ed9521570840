"""``memgym bench ...``: the benchmarks of :mod:`launch.bench`, each printing ratios measured side
by side in one run (never timed tests: this machine is shared and noisy)."""
from __future__ import annotations

from launch.bench import coldchat, constrained, embed, evolve, retrieval, reuse, reward, sandbox, train

#: Benchmarks in ``memgym bench --help`` order; each defines ``register_bench(subparsers)``.
BENCH_MODULES = (retrieval, reward, train, reuse, evolve, constrained, sandbox, embed, coldchat)


def register(sub) -> None:
    p = sub.add_parser("bench", help="benchmarks that print ratios measured in one run",
                       description="Benchmarks that print ratios measured side by side in one run.")
    s = p.add_subparsers(dest="bench_command", metavar="BENCH")
    s.required = True
    for mod in BENCH_MODULES:
        mod.register_bench(s)
