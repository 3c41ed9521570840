"""The recipe parser of every recipe command (``memgym train sft|adrpo`` and the ``python -m
memgym.training.sft|adrpo`` that ``memgym launch`` runs in each process, ``memgym eval``,
``program eval``, ``evolve``, ``evolve experiment``): :class:`RecipeParser`, a ``trl.TrlParser``
of the command's tuple of settings dataclasses with ``--config R.yaml`` (alias ``--recipe``).

:meth:`RecipeParser.parse` reads the recipe's YAML keys as the fields' defaults (TRL's
``set_defaults_with_config``; its ``env:`` mapping is exported), applies the command's own
defaults over them (``defaults(argv)``: the trainers' CPU settings, ``evolve --from RUN``), then
parses ``argv`` once: a flag overrides the recipe, and argparse converts each value once (a
recipe's text value when no flag replaced it). :func:`recipe_configs` builds one instance of each
dataclass from the parsed values (as ``HfArgumentParser.parse_args_into_dataclasses`` does).

Every error is a :class:`memgym.llm.errors.ConfigError` (exit status 2): a YAML key or flag no
field has (one line, each named with its closest field or the field that replaced an old name), a
stray word, a recipe value or flag value of the wrong type or outside the field's choices (naming
the recipe and the key, or the flag; a recipe's null, list or mapping is checked against the
field's annotation before any dataclass sees it, and its numbers and bools are converted by the
field's type as a flag's text is: ``rounds_cold: 2.5`` fails), a missing value or required argument, a missing
recipe, a recipe that is not UTF-8, broken YAML (a key given twice included) or no mapping;
a recipe path that is a folder is ``IsADirectoryError`` (exit status 1).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml
from trl import TrlParser

from memgym.llm.checks import unknown_names_message
from memgym.llm.errors import ConfigError

#: The flags that name the recipe file.
RECIPE_FLAGS = ("--config", "--recipe")


class DefaultsOnceHelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """``--help`` adds ``(default: X)`` to a field's help unless the help already states its
    default (a default set per command or read from the environment)."""

    def _get_help_string(self, action):
        return action.help if "(default" in (action.help or "") else super()._get_help_string(action)


def option_value(argv: Sequence[str], *flags: str) -> str | None:
    """The value ``argv`` gives the last of ``flags`` (``--flag V`` or ``--flag=V``), or None."""
    value = None
    for i, a in enumerate(argv):
        name, eq, rest = a.partition("=")
        if name in flags:
            value = rest if eq else (argv[i + 1] if i + 1 < len(argv) else None)
    return value


def given(argv: Sequence[str], flags: Sequence[str]) -> bool:
    """Whether ``argv`` gives any of ``flags`` (``--flag``, ``--flag V`` or ``--flag=V``)."""
    return any(a.partition("=")[0] in flags for a in argv)


class RecipeParser(TrlParser):
    """A ``trl.TrlParser`` of ``dataclass_types`` with ``--config R.yaml`` (alias ``--recipe``).
    ``defaults(argv)``: field values applied over the recipe's and under the flags."""

    def __init__(self, dataclass_types, *, defaults: Callable[[list[str]], dict] | None = None, **kwargs):
        self.extra_dests: set[str] = set()
        kwargs.setdefault("formatter_class", DefaultsOnceHelpFormatter)
        super().__init__(tuple(dataclass_types), allow_abbrev=False, exit_on_error=False, **kwargs)
        self.command_defaults = defaults
        self.add_argument(*RECIPE_FLAGS, dest="config", metavar="R.yaml", default=None,
                          help="YAML recipe whose keys set the fields below; flags given after it override it")

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        if action.option_strings and action.dest != "help":
            self.extra_dests.add(action.dest)
        return action

    def error(self, message):  # argparse's own errors (a missing value or required argument)
        raise ConfigError(message)

    def fields(self) -> list[str]:
        """Every name a recipe key or a ``--flag`` may have (the fields and the command's options)."""
        return sorted({f.name for d in self.dataclass_types for f in dataclasses.fields(d) if f.init}
                      | self.extra_dests)

    def renamed(self) -> dict:
        """Old field name -> the field that replaced it (the dataclasses' ``RENAMED``)."""
        out: dict = {}
        for dtype in self.dataclass_types:
            for cls in reversed(dtype.__mro__):
                out.update(cls.__dict__.get("RENAMED", {}))
        return out

    def field_shapes(self, name: str) -> set[str]:
        """The YAML shapes field ``name`` takes (:func:`_shapes` of its annotation; ``{"any"}``
        when it cannot be resolved: the dataclass checks the value)."""
        for dtype in self.dataclass_types:
            if name in {f.name for f in dataclasses.fields(dtype)}:
                try:
                    return _shapes(typing.get_type_hints(dtype)[name])
                except Exception:
                    return {"any"}
        return {"any"}

    def recipe_value(self, path: Path, name: str, value):
        """Recipe ``value`` of field ``name`` as the parser takes it: a YAML number or bool of a
        field of value types as text, which the field's type converts as it converts a flag's
        (``rounds_cold: 2.5`` fails as ``--rounds_cold 2.5`` does). Raises :class:`ConfigError`
        for a null, list or mapping the field's annotation does not take."""
        shapes = self.field_shapes(name)
        shape = "null" if value is None else "list" if isinstance(value, list) else \
            "mapping" if isinstance(value, dict) else None
        if "any" in shapes or shape in shapes:
            return value
        if shape is not None:
            raise ConfigError(f"recipe {path}: {name}: {' or '.join(sorted(shapes - {'null'})) or 'null'} expected, "
                              f"got {'null' if value is None else repr(value)}")
        return value if isinstance(value, str) or "list" in shapes else str(value)

    def load_recipe(self, path: str) -> dict:
        """Set the YAML keys of recipe ``path`` as the fields' defaults and export its ``env:``
        mapping (``trl.TrlParser``'s rules); returns the keys set."""
        p = Path(path)
        if p.is_dir():
            raise IsADirectoryError(21, "Is a directory; the recipe must be a YAML file", str(p))
        if not p.is_file():
            raise ConfigError(f"recipe {p} not found")
        from memgym.llm.runcard import record_input

        record_input(p, "recipe")
        try:
            data = yaml.load(p.read_text(encoding="utf-8"), Loader=UniqueKeyLoader) or {}
        except UnicodeDecodeError as e:
            raise ConfigError(f"recipe {p}: not UTF-8 text (byte {e.start}: {e.reason})") from None
        except yaml.YAMLError as e:
            raise ConfigError(f"recipe {p}: broken YAML: {' '.join(str(e).split())}") from e
        if not isinstance(data, dict):
            raise ConfigError(f"recipe {p}: a YAML mapping of field: value expected, got {type(data).__name__}")
        env = data.pop("env", {}) or {}
        if not isinstance(env, dict):
            raise ConfigError(f"recipe {p}: env must be a mapping of variable: value")
        unknown = [k for k in data if k not in self.fields()]
        if unknown:
            raise ConfigError(f"recipe {p}: " + unknown_names_message(unknown, self.fields(), self.renamed(), prefix=""))
        data = {k: self.recipe_value(p, k, v) for k, v in data.items()}
        self.set_defaults_with_config(**data)
        for k, v in env.items():
            os.environ[k] = str(v)
        return data

    def parse(self, argv: Sequence[str]) -> argparse.Namespace:
        """The recipe (``--config``), the command's defaults, then ``argv``, parsed once."""
        argv = list(argv)
        recipe_path = option_value(argv, *RECIPE_FLAGS)
        recipe = self.load_recipe(recipe_path) if recipe_path else {}
        if self.command_defaults:
            self.set_defaults(**self.command_defaults(argv))
        try:
            args, extra = self.parse_known_args(argv)
        except argparse.ArgumentError as e:
            if isinstance(e.__context__, ConfigError):  # a field type's own message (``--budgets``)
                raise e.__context__ from None
            names = (e.argument_name or "").split("/")
            key = names[0].lstrip("-")
            if key in recipe and not given(argv, names):  # the recipe's text value
                raise ConfigError(f"recipe {recipe_path}: {key}: {e.message}") from None
            raise ConfigError(str(e)) from None
        for action in self._actions:  # argparse checks the choices of flag values only
            key = action.dest
            if (action.choices is not None and key in recipe and not given(argv, action.option_strings)
                    and getattr(args, key) not in action.choices):
                raise ConfigError(f"recipe {recipe_path}: {key}: invalid choice: {getattr(args, key)!r} (choose from "
                                  f"{', '.join(map(str, action.choices))})")
        if extra:
            flags = [a for a in extra if a.startswith("-")]
            if not flags:
                raise ConfigError(f"unexpected argument(s): {' '.join(extra)} (a field is given as --field value)")
            raise ConfigError(unknown_names_message(flags, self.fields(), self.renamed()))
        args.recipe_parser = self
        return args


def _shapes(hint) -> set[str]:
    """The YAML shapes a field typed ``hint`` takes: ``null``, ``list`` (also one value),
    ``mapping``, the name of a value type (str, int, float, bool, an enum), or ``any`` (another
    class, which converts values itself)."""
    import enum
    import types

    origin = typing.get_origin(hint)
    if origin in (typing.Union, types.UnionType):
        return set().union(*(_shapes(a) for a in typing.get_args(hint)))
    if hint is type(None):
        return {"null"}
    if origin in (list, tuple, set, frozenset) or hint in (list, tuple, set, frozenset):
        return {"list"}
    if origin is dict or hint is dict:
        return {"mapping"}
    if origin is typing.Literal:
        return {"str"}
    if hint in (str, int, float, bool) or (isinstance(hint, type) and issubclass(hint, enum.Enum)):
        return {hint.__name__}
    return {"any"}


class UniqueKeyLoader(yaml.SafeLoader):
    """``yaml.SafeLoader`` that refuses a mapping giving one key twice (PyYAML keeps the last)."""

    def construct_mapping(self, node, deep=False):
        seen = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if isinstance(key, typing.Hashable) and key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key) if isinstance(key, typing.Hashable) else None
        return super().construct_mapping(node, deep=deep)


def recipe_configs(args: argparse.Namespace) -> tuple:
    """One instance of each settings dataclass of the parsed recipe command, from the parsed
    values (each dataclass validates itself once)."""
    values = vars(args)
    out = []
    for dtype in args.recipe_parser.dataclass_types:
        keys = {f.name for f in dataclasses.fields(dtype) if f.init}
        out.append(dtype(**{k: v for k, v in values.items() if k in keys}))
    return tuple(out)


def given_fields(args: argparse.Namespace, allowed: Sequence[str] = ()) -> list[str]:
    """The ``--flags`` of the parsed command's fields whose value differs from the field's
    default (a recipe or a flag set them), except ``allowed``."""
    out = []
    for dtype in args.recipe_parser.dataclass_types:
        for f in dataclasses.fields(dtype):
            if not f.init or f.name in allowed or not hasattr(args, f.name):
                continue
            default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
            if getattr(args, f.name) != default:
                out.append(f"--{f.name}")
    return sorted(out)
