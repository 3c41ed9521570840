"""The ``memgym`` command line. Each command group lives in its own ``launch/cmd_*.py``
module exposing ``register(subparsers)``; this file wires them into one argparse tree and maps
errors to exit statuses, here and nowhere else.

A recipe command (``train sft|adrpo``, ``eval``, ``program eval``, ``evolve [experiment]``) is a
placeholder in the tree (:mod:`memgym.launch.registry`): the tree parses the command words, then the
command's parser (:class:`memgym.llm.recipe.RecipeParser`) is built and parses the arguments after
them once.

Errors: an ordinary mistake (a bad recipe value, a missing or unreadable file, broken YAML or
data, a dead or misbehaving server, a corrupt cache: a :class:`memgym.llm.errors.MemgymError`, or one
of the few outside types of :func:`memgym.llm.errors.exit_status`) ends in ONE line on stderr,
``memgym <command>: <what and where>``, and exit status 2 (``kind == "usage"``: a config or
usage error) or 1 (anything else). Any other exception is a bug and keeps its
traceback; ``--debug`` or ``MEMGYM_DEBUG=1`` shows the traceback of every error.
"""
from __future__ import annotations

import argparse
import os
import sys

from memgym.launch import (cmd_annotate, cmd_bank, cmd_data, cmd_eval, cmd_evolve, cmd_launch, cmd_models,
                    cmd_program, cmd_reproduce, cmd_reward, cmd_score, cmd_serve, cmd_synth, cmd_train)
from memgym.llm import runcard
from memgym.llm.errors import report_errors
from memgym.launch.registry import choose

#: Command groups in ``memgym --help`` order; each defines ``register(subparsers)``.
COMMAND_MODULES = (cmd_models, cmd_data, cmd_bank, cmd_eval, cmd_score, cmd_program, cmd_annotate, cmd_evolve,
                   cmd_synth, cmd_reward, cmd_train, cmd_launch, cmd_serve, cmd_reproduce)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="memgym",
        description="memgym: train memory-construction LLMs (SFT + ADRPO) and evolve memory programs. "
                    "Recipe-driven commands (train, eval, program eval, evolve) take --config R.yaml (alias "
                    "--recipe) and --<field> value overrides; `memgym COMMAND --help` lists them.",
    )
    p.add_argument("--debug", action="store_true",
                   help="show the full traceback of every error (also: MEMGYM_DEBUG=1)")
    sub = p.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    for mod in COMMAND_MODULES:
        mod.register(sub)
    return p


def run_command(args, command) -> int:
    """Run ``args.func(args)`` (``args`` may also be a callable that parses and returns the
    namespace) under :func:`memgym.llm.errors.report_errors`, the one place errors become exit
    statuses: a user error becomes one stderr line ``memgym <command>: ...`` and exit status 2 or 1;
    ``--debug``/``MEMGYM_DEBUG=1`` re-raises it. ``command``: the command's name for the message."""
    before = os.environ.get("MEMGYM_DEBUG")

    def call(args):
        if callable(args) and not hasattr(args, "func"):
            args = args()
        if getattr(args, "debug", False):
            os.environ["MEMGYM_DEBUG"] = "1"
        return args.func(args)

    try:
        return report_errors(f"memgym {command}", call, args)
    finally:
        if before is None:
            os.environ.pop("MEMGYM_DEBUG", None)
        else:
            os.environ["MEMGYM_DEBUG"] = before


def _show_data_warnings_plainly() -> None:
    """Print data-quirk warnings as ``warning: <message>`` lines (as ``memgym data stats``
    does), not in Python's file:line format; other warnings keep the default display."""
    import warnings

    from memgym.data_synth.errors import DataQuirkWarning

    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):
        if issubclass(category, DataQuirkWarning):
            print(f"warning: {message}", file=file or sys.stderr)
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


#: Commands whose time is mostly the embedder's forward pass (program eval, evolve, eval).
PASSIVE_OMP_COMMANDS = ("program", "evolve", "eval")


def passive_openmp(command: str) -> bool:
    """For :data:`PASSIVE_OMP_COMMANDS`, default ``OMP_WAIT_POLICY`` to ``PASSIVE`` before torch
    (and its OpenMP runtime) is imported; a value the user set is kept. Returns whether it set it.

    Why: on the shared 2-core box an OpenMP thread that has no work spins, taking the CPU from
    the one that has. Measured (100 BEAM-1M-3 lines, all-MiniLM-L6-v2, batches of 8, 2 torch
    threads, load average ~7): 14.1 CPU s / 56.6 s wall spinning (``ACTIVE``) vs 4.0 CPU s /
    17.0 s wall ``PASSIVE``, the same as 1 thread (4.1 / 16.6); the vectors are the same."""
    if command not in PASSIVE_OMP_COMMANDS or "OMP_WAIT_POLICY" in os.environ or "torch" in sys.modules:
        return False
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    return True


def main(argv: list[str] | None = None) -> int:
    _show_data_warnings_plainly()
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    words = [a for a in argv if not a.startswith("-")]
    passive_openmp(words[0] if words else "")
    before = os.environ.get("MEMGYM_DEBUG")
    if "--debug" in argv[: argv.index(words[0]) if words else len(argv)]:
        os.environ["MEMGYM_DEBUG"] = "1"  # errors while parsing show their traceback too
    runcard.begin(["memgym", *argv])  # the command line every report's run card names
    try:
        words, parse_args = choose(parser, argv)
        return run_command(parse_args, " ".join(words))
    finally:
        runcard.begin(None)
        if before is None:
            os.environ.pop("MEMGYM_DEBUG", None)
        else:
            os.environ["MEMGYM_DEBUG"] = before


if __name__ == "__main__":
    sys.exit(main())
