"""The ``memgym`` command line. Each command group lives in its own ``launch/cmd_*.py`` module
exposing ``register(subparsers)``; this file only wires them together. Commands configured by
``trl.TrlParser`` (train, eval, program eval) take their arguments verbatim
(:mod:`launch.passthrough`)."""
from __future__ import annotations

import argparse
import sys

from launch import (cmd_bank, cmd_bench, cmd_data, cmd_eval, cmd_launch, cmd_models, cmd_program, cmd_reward,
                    cmd_serve, cmd_synth, cmd_train)

#: Command groups in ``memgym --help`` order; each defines ``register(subparsers)``.
COMMAND_MODULES = (cmd_models, cmd_data, cmd_bank, cmd_eval, cmd_bench, cmd_program, cmd_synth, cmd_reward, cmd_train,
                   cmd_launch, cmd_serve)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memgym",
        description="memgym: train memory-construction LLMs (SFT + ADRPO) and evolve memory programs. "
                    "Recipe-driven commands (train, eval, program eval) take --config R.yaml (alias --recipe) "
                    "and --<field> value overrides; `memgym COMMAND --help` lists them.",
    )
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in COMMAND_MODULES:
        mod.register(sub)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(list(sys.argv[1:] if argv is None else argv))
    return int(args.func(args) or 0)


if __name__ == "__main__":
    sys.exit(main())
