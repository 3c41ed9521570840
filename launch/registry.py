"""The recipe commands' places in the ``memgym`` tree, as TRL's own CLI adds its training
scripts: :func:`add_recipe_command` adds a placeholder (listed by ``--help``, no arguments), and
:func:`choose` parses the command words with the tree, then builds the chosen command's
:class:`memgym.llm.recipe.RecipeParser` with its ``make_parser(prog)`` (only then are its settings,
models and TRL imported), which parses the arguments after the words once.
"""
from __future__ import annotations

import argparse


def add_recipe_command(subparsers, name: str, make_parser, *, help: str, subcommands: dict | None = None) -> None:
    """Add recipe command ``name`` to the tree as a placeholder listed with ``help``;
    ``make_parser(prog)`` builds its :class:`memgym.llm.recipe.RecipeParser` (with ``func`` set)
    when it is chosen. ``subcommands``: word -> ``make_parser`` of a command under this one
    (``evolve experiment``), chosen by the first argument after ``name``."""
    p = subparsers.add_parser(name, help=help, add_help=False)
    p.set_defaults(make_parser=make_parser, subcommands=subcommands or {})


def command_words(args) -> list[str]:
    """The command words the tree chose (``["program", "eval"]``) from its parsed ``args``."""
    return [args.command, *(v for k, v in vars(args).items() if k.endswith("_command") and isinstance(v, str))]


def choose(parser: argparse.ArgumentParser, argv: list[str]):
    """Parse the command words of ``argv`` with the ``memgym`` tree: ``(words, parse)``, where
    ``parse()`` returns the command's arguments: the tree's own commands as argparse parses them
    (argparse's usage errors exit 2 here); a recipe command's arguments (those after its words)
    parsed once by its parser, built when ``parse()`` is called."""
    args, extra = parser.parse_known_args(argv)
    words = command_words(args)
    make = getattr(args, "make_parser", None)
    if make is None:
        if extra:
            parser.error("unrecognized arguments: " + " ".join(extra))
        return words, lambda: args
    i = 0
    for w in words:
        i = argv.index(w, i) + 1
    rest = argv[i:]
    if rest and rest[0] in args.subcommands:
        make, words, rest = args.subcommands[rest[0]], [*words, rest[0]], rest[1:]
    return words, lambda: make(prog="memgym " + " ".join(words)).parse(rest)


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """The parsed arguments of ``argv`` (:func:`choose`)."""
    return choose(parser, argv)[1]()


