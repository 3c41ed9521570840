"""``memgym bench ...``: one module per benchmark, each defining ``register_bench(subparsers)``.
Every benchmark prints ratios measured side by side in one run (never timed tests: this
machine is shared and noisy)."""
