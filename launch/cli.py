"""The ``memgym`` command line. Each command group lives in its own ``launch/cmd_*.py``
module exposing ``register(subparsers)``; this file only wires them together."""
from __future__ import annotations

import argparse
import importlib
import sys

# (module, help) — each module defines register(subparsers) that adds its parser(s).
COMMAND_MODULES = [
    "launch.cmd_models",
    "launch.cmd_data",
    "launch.cmd_bank",
    "launch.cmd_eval",
    "launch.cmd_score",
    "launch.cmd_bench",
    "launch.cmd_program",
    "launch.cmd_synth",
    "launch.cmd_reward",
    "launch.cmd_train",
    "launch.cmd_launch",
    "launch.cmd_serve",
]


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memgym",
        description="memgym: train memory-construction LLMs (SFT + ADRPO) and evolve memory programs.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for name in COMMAND_MODULES:
        try:
            mod = importlib.import_module(name)
        except ModuleNotFoundError as e:  # a command group not yet installed
            if e.name == name:
                continue
            raise
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    argv = list(sys.argv[1:] if argv is None else argv)
    args, unknown = parser.parse_known_args(argv)
    if getattr(args, "passthrough", None):
        # Commands configured by TrlParser (a YAML recipe + field overrides) take every
        # argument after their own name(s) verbatim; argparse's REMAINDER drops leading flags.
        words = args.passthrough
        start = next(i for i in range(len(argv)) if argv[i: i + len(words)] == list(words)) + len(words)
        args.rest = argv[start:]
    elif unknown:
        parser.error(f"unrecognized arguments: {' '.join(unknown)}")
    rc = args.func(args)
    return int(rc or 0)


if __name__ == "__main__":
    sys.exit(main())
