"""The command registry: how ``memgym``'s commands are added to one argparse tree, and how a
recipe command's arguments become its settings dataclasses.

- :class:`Commands` is the sub-command action of every level of the tree. A command whose
  parser is costly to build (its settings dataclasses import models, data and TRL) is added
  with :meth:`Commands.add_lazy`: its parser is built, in the tree, only when its name is
  parsed, so ``memgym --help`` and the light commands do not import it.
- A recipe command (``memgym eval``, ``program eval``, ``evolve``, ``evolve experiment``,
  ``train sft|adrpo``) is a ``trl.TrlParser`` added to the tree as TRL's own scripts add
  theirs (``make_parser(subparsers)`` calls ``subparsers.add_parser(name,
  dataclass_types=...)``); :func:`add_recipe_args` gives it ``--config R.yaml`` (alias
  ``--recipe``) and marks it. :func:`parse` parses ``argv`` once for the command, then again
  with the recipe's YAML keys as the parser's defaults (flags given override them), and
  :func:`recipe_configs` builds one instance per dataclass (each validates itself once).

Errors are :class:`memgym.llm.errors.ConfigError` (a YAML key or flag no field has, each named with
its closest field, or the field that replaced an old name; a recipe that is no YAML mapping;
a missing recipe file), ``IsADirectoryError`` for a recipe path that is a folder; :func:`memgym.launch.cli.run_command`
maps them to exit codes.
"""
from __future__ import annotations

import argparse
import dataclasses
import os
from collections.abc import Callable, Sequence
from pathlib import Path

from memgym.llm.checks import unknown_names_message
from memgym.llm.errors import ConfigError


class Commands(argparse._SubParsersAction):
    """Sub-commands of one level of the ``memgym`` tree; :meth:`add_lazy` defers a parser."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._lazy: dict[str, Callable] = {}

    def add_lazy(self, name: str, make_parser: Callable[["Commands"], argparse.ArgumentParser], *,
                 help: str) -> None:
        """Add command ``name`` whose parser ``make_parser(self)`` adds (with
        ``self.add_parser(name, ...)``) when ``name`` is parsed; until then ``memgym --help``
        lists it with ``help``."""
        self.add_parser(name, help=help, add_help=False)
        self._lazy[name] = make_parser

    def add_parser(self, name, **kwargs):
        """``argparse``'s, plus ``dataclass_types=`` (a ``trl.TrlParser`` sub-parser, as TRL's
        ``make_parser(subparsers)`` asks) on a level whose parsers are plain."""
        if "dataclass_types" in kwargs:
            kwargs.setdefault("formatter_class", DefaultsOnceHelpFormatter)
        if "dataclass_types" not in kwargs or issubclass(self._parser_class, _trl_parser()):
            return super().add_parser(name, **kwargs)
        plain, self._parser_class = self._parser_class, _trl_parser()
        try:
            return super().add_parser(name, **kwargs)
        finally:
            self._parser_class = plain

    def resolve(self, name: str) -> argparse.ArgumentParser:
        """The parser of command ``name``, built now if it is lazy (KeyError: no such command)."""
        make_parser = self._lazy.pop(name, None)
        if make_parser is not None:  # replace the listing-only parser with the real one
            del self._name_parser_map[name]
            self._choices_actions[:] = [a for a in self._choices_actions if a.dest != name]
            make_parser(self)
        return self._name_parser_map[name]

    def __call__(self, parser, namespace, values, option_string=None):
        if values and values[0] in self._name_parser_map:
            self.resolve(values[0])
        super().__call__(parser, namespace, values, option_string)


class DefaultsOnceHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` adds ``(default: X)`` to a field's help unless the help already states its
    default (a default set per command or read from the environment)."""

    def _get_help_string(self, action):
        return action.help if "(default" in (action.help or "") else super()._get_help_string(action)


def chosen(parser: argparse.ArgumentParser, argv: Sequence[str]) -> tuple[list[str], argparse.ArgumentParser]:
    """The command words of ``argv`` (``["program", "eval"]``) and the parser they choose,
    walking the tree (lazy parsers are built on the way)."""
    words: list[str] = []
    for a in argv:
        if a.startswith("-"):
            continue
        subs = [x for x in parser._actions if isinstance(x, argparse._SubParsersAction)]
        if not subs or a not in subs[0].choices:
            break
        words.append(a)
        parser = subs[0].resolve(a) if isinstance(subs[0], Commands) else subs[0].choices[a]
    return words, parser


def _trl_parser():
    from trl import TrlParser

    return TrlParser


def add_recipe_args(parser, *, defaults: Callable[[argparse.Namespace], dict] | None = None) -> None:
    """Mark ``parser`` (a ``TrlParser`` in the tree) as a recipe command: ``--config R.yaml``
    (alias ``--recipe``), whose YAML keys become the field defaults. ``defaults(args)``: values
    applied over the recipe's and under the flags (the trainers' CPU settings; ``evolve
    --from RUN``'s recipe), given the arguments as first parsed."""
    parser.add_argument("--config", "--recipe", dest="config", metavar="R.yaml", default=None,
                        help="YAML recipe whose keys set the fields below; flags given after it override it")
    parser.set_defaults(recipe_parser=parser, recipe_defaults=defaults)


def _renamed(parser) -> dict:
    out: dict = {}
    for dtype in getattr(parser, "dataclass_types", ()):
        for cls in reversed(dtype.__mro__):
            out.update(cls.__dict__.get("RENAMED", {}))
    return out


def _known(parser) -> list[str]:
    return sorted({a.dest for a in parser._actions if a.option_strings and a.dest != "help"})


def load_recipe(parser, path: str) -> None:
    """Set the YAML keys of recipe ``path`` as ``parser``'s defaults and export its ``env:``
    mapping (``trl.TrlParser``'s rules). Raises ConfigError naming keys no field has."""
    import yaml

    p = Path(path)
    if p.is_dir():
        raise IsADirectoryError(21, "Is a directory; the recipe must be a YAML file", str(p))
    if not p.is_file():
        raise ConfigError(f"recipe {p} not found")
    from memgym.llm.runcard import record_input

    record_input(p, "recipe")
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as e:
        raise ConfigError(f"recipe {p}: broken YAML: {' '.join(str(e).split())}") from e
    if not isinstance(data, dict):
        raise ConfigError(f"recipe {p}: a YAML mapping of field: value expected, got {type(data).__name__}")
    env = data.pop("env", {}) or {}
    if not isinstance(env, dict):
        raise ConfigError(f"recipe {p}: env must be a mapping of variable: value")
    unknown = [k for k in data if k not in _known(parser)]
    if unknown:
        raise ConfigError(f"recipe {p}: " + unknown_names_message(unknown, _known(parser), _renamed(parser), prefix=""))
    for k, v in env.items():
        os.environ[k] = str(v)
    _check_values(parser, p, data)
    parser.set_defaults_with_config(**data)


def _check_values(parser, path: Path, data: dict) -> None:
    """Convert every text value of the recipe with its field's argparse type, so that a bad value
    is a ConfigError naming the recipe and the key (argparse would name a flag nobody typed)."""
    actions = {a.dest: a for a in parser._actions}
    for key, value in data.items():
        action = actions.get(key)
        convert = getattr(action, "type", None)
        if convert is None or convert is str:
            continue
        for v in value if isinstance(value, list) else [value]:
            if isinstance(v, str):
                try:
                    convert(v)
                except (TypeError, ValueError, argparse.ArgumentTypeError):
                    name = getattr(convert, "__name__", "value")
                    raise ConfigError(f"recipe {path}: {key}: {v!r} is not a valid {name}") from None


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """Parse ``argv`` with the ``memgym`` tree. For a recipe command the recipe's keys become the
    defaults and ``argv`` is parsed again (flags override the recipe); a flag no field has is a
    ConfigError. Other commands keep argparse's own errors (exit status 2)."""
    words, leaf = chosen(parser, argv)
    if leaf.get_default("recipe_parser") is not leaf:
        return parser.parse_args(argv)
    rest, i = list(argv), 0
    for w in words:  # the arguments after the command words
        i = rest.index(w, i) + 1
    options = {o for a in leaf._actions for o in a.option_strings}
    unknown = [a for a in rest[i:] if a.startswith("--") and a.split("=", 1)[0] not in options]
    if unknown:
        raise ConfigError(unknown_names_message(unknown, _known(leaf), _renamed(leaf)))
    args, extra = parser.parse_known_args(argv)
    if args.config:
        load_recipe(leaf, args.config)
    if args.recipe_defaults:
        leaf.set_defaults(**args.recipe_defaults(args))
    if args.config or args.recipe_defaults:
        args, extra = parser.parse_known_args(argv)
    if extra:
        flags = [a for a in extra if a.startswith("-")] or extra
        raise ConfigError(unknown_names_message(flags, _known(leaf), _renamed(leaf)))
    return args


def recipe_configs(args: argparse.Namespace) -> tuple:
    """One instance of each settings dataclass of the parsed recipe command, from the parsed
    values (as ``HfArgumentParser.parse_args_into_dataclasses`` builds them)."""
    values = vars(args)
    out = []
    for dtype in args.recipe_parser.dataclass_types:
        keys = {f.name for f in dataclasses.fields(dtype) if f.init}
        out.append(dtype(**{k: v for k, v in values.items() if k in keys}))
    return tuple(out)


def given_fields(args: argparse.Namespace, allowed: Sequence[str] = ()) -> list[str]:
    """The ``--flags`` of the recipe command's fields whose parsed value differs from the
    field's default (a recipe or a flag set them), except ``allowed``."""
    leaf = args.recipe_parser
    fields = {f.name for d in leaf.dataclass_types for f in dataclasses.fields(d)}
    return sorted(f"--{a.dest}" for a in leaf._actions
                  if a.dest in fields and a.dest not in allowed and a.option_strings
                  and a.option_strings[0] == f"--{a.dest}" and getattr(args, a.dest, a.default) != a.default)
