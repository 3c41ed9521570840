"""The one rule for commands configured by ``trl.TrlParser`` (a YAML recipe plus field
overrides): ``memgym train sft|adrpo``, ``memgym eval``, ``memgym program eval`` and ``memgym evolve`` take every
argument after their command words verbatim and hand it to the command's parser
(:func:`llm.recipes.parse_recipe`: ``--config R.yaml``, alias ``--recipe``, then any
``--<field> value``), so ``--help`` after the command words prints the recipe fields."""
from __future__ import annotations

import argparse
from collections.abc import Callable

ARGS_HELP = "--config R.yaml (alias --recipe) and --<field> value overrides; --help lists every field"


def add_recipe_command(sub, name: str, *, help: str, description: str,
                       run: Callable[[list[str]], int]) -> argparse.ArgumentParser:
    """Add command ``name`` to ``sub`` whose arguments all go, unparsed, to ``run(argv)``.

    The sub-parser uses ``prefix_chars="+"``, so argparse reads none of the ``--flags`` (an
    ``argparse.REMAINDER`` would drop a leading one) and has no ``--help`` of its own."""
    p = sub.add_parser(name, help=help, description=description, add_help=False, prefix_chars="+")
    p.add_argument("args", nargs="*", metavar="ARG", help=ARGS_HELP)
    p.set_defaults(func=lambda a: run(list(a.args)))
    return p
