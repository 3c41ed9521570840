"""Recipes: the one TrlParser recipe parser (:func:`parse_recipe`: ``--config R.yaml`` plus
CLI overrides, for ``memgym train``, ``eval``, ``program eval`` and ``evolve``) and the
parse-time checks shared by the recipe dataclasses (``EvalConfig``, ``ProgramEvalConfig``,
``ADRPOConfig``, ``SFTScriptArguments``) and, through :func:`at_least`, by the argparse
commands (``synth``, ``reward audit``, ``bench``), so a bad value fails before any model loads,
with a message naming the field, the value and what is allowed.

A config declares its rules in a class attribute ``CHECKS = {field: {rule: value}}`` (not in
``field(metadata=...)``: ``HfArgumentParser`` hands every metadata key to argparse) and calls
:func:`check_fields` from ``__post_init__`` (``trl.TrlParser`` builds the dataclass, so the
checks run at parse time for recipes and CLI overrides alike). Rules:

- ``"min": m``: a number >= ``m`` (``None`` only when the field's default is ``None``);
  counts use ``min: 1``, so 0 and negatives never silently mean "all" or "all but one";
- ``"choices": (...)``: one of these values (also read from the field's metadata, where
  argparse checks it for CLI values; a YAML value skips argparse, so it is checked here);
- ``"spec": "backend"``: a backend spec (``hf:``/``openai:``/``vllm:``, :func:`check_spec`);
  ``"spec": "extractor"``: a backend spec, ``expert:<file or conv-NN>[,...]`` or one of
  the rule ``"words"`` (e.g. ``("instruction",)``); on a ``list[str]`` field every item is checked;
  a rule ``"options": (...)`` allows one of these words after the spec, separated by a space
  (eval columns: ``"hf:smollm2 constrained"``); the spec before it is checked;
- ``"out_dir": True``: an output directory: must not be an existing file.

A ``list[...]`` field given a single string (``conversations: conv-30`` in YAML) becomes a
one-element list instead of being split into characters. Cross-field rules go through
:func:`require`. Errors are :class:`ConfigError` (a ``ValueError``).
"""
from __future__ import annotations

import dataclasses
import sys
from collections.abc import Sequence
from pathlib import Path

from llm.errors import ConfigError, OutputPathError
from llm.specs import check_spec


def _flag(name: str) -> str:
    return f"--{name}"


def _admits_none(f: dataclasses.Field) -> bool:
    # ``HfArgumentParser`` rewrites ``int | None`` field types to ``int`` in place, so the
    # default tells: a field whose default is None may stay None ("not set")
    return f.default is None


def _is_list(f: dataclasses.Field) -> bool:
    t = f.type if isinstance(f.type, str) else repr(f.type)
    return t.replace("typing.", "").lower().startswith("list")


def at_least(lo: float, kind: type = int):
    """An argparse ``type=`` for the commands that are not dataclass recipes: parses ``kind``
    and rejects values below ``lo`` at parse time (``--n-sessions 0`` is an error, never "all")."""
    import argparse

    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {'an integer' if kind is int else 'a number'}, "
                                             f"got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"must be >= {lo}, got {text}")
        return value

    parse.__name__ = kind.__name__
    return parse


def check_out_dir(path: str | Path, field: str = "out") -> None:
    """Raise :class:`OutputPathError` when ``path`` exists and is not a directory."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        raise OutputPathError(f"{_flag(field)} {path}: is an existing file, not a directory; give a directory "
                              "path (it is created if missing)")


def check_fields(obj) -> None:
    """Apply the ``CHECKS`` rules (module docstring) to every field of the dataclass ``obj``,
    in field order; a single string on a list field becomes a one-element list (in place).
    Raises :class:`ConfigError` naming the first bad field."""
    rules = getattr(type(obj), "CHECKS", {})
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        meta = {**({"choices": f.metadata["choices"]} if "choices" in (f.metadata or {}) else {}),
                **rules.get(f.name, {})}
        if _is_list(f) and isinstance(value, str):
            value = [value]
            setattr(obj, f.name, value)
        if "min" in meta:
            lo = meta["min"]
            if value is None:
                if not _admits_none(f):
                    raise ConfigError(f"{_flag(f.name)}: expected a number >= {lo}, got null")
            elif isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{_flag(f.name)}: expected a number >= {lo}, got {value!r}")
            elif value < lo:
                raise ConfigError(f"{_flag(f.name)}: must be >= {lo}, got {value}")
        if "choices" in meta and value is not None and value not in meta["choices"]:
            raise ConfigError(f"{_flag(f.name)}: {value!r} is not one of {', '.join(map(str, meta['choices']))}")
        if meta.get("spec") and value is not None:
            for item in (value if isinstance(value, list) else [value]):
                if isinstance(item, str) and meta.get("options"):
                    head, _, word = item.strip().rpartition(" ")
                    item = head if head and word in meta["options"] else item
                check_spec(item, f.name, kind=meta["spec"], words=tuple(meta.get("words", ())))
        if meta.get("out_dir") and value:
            check_out_dir(value, f.name)


def require(obj, field: str, value, needs: str, why: str = "") -> None:
    """Cross-field rule: when ``obj.<field> == value``, ``obj.<needs>`` must be set.
    Raises :class:`ConfigError` naming both flags (e.g. ``--scorer llm needs --judge_model``)."""
    if getattr(obj, field) == value and not getattr(obj, needs):
        raise ConfigError(f"{_flag(field)} {value} needs {_flag(needs)}{' ' + why if why else ''}")


def cuda_available() -> bool:
    """True when torch sees at least one CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def device_default_args(cuda: bool | None = None) -> list[str]:
    """CLI flags to put *before* the user's arguments so that a TRL config runs on a machine
    without CUDA: ``--use_cpu true --bf16 false --fp16 false`` (TRL 1.16 defaults ``bf16``
    to True). They override the recipe YAML, and any later flag on the command line overrides
    them. With CUDA (``cuda=None`` asks torch) the list is empty."""
    cuda = cuda_available() if cuda is None else cuda
    return [] if cuda else ["--use_cpu", "true", "--bf16", "false", "--fp16", "false"]


def config_argv(argv: Sequence[str]) -> list[str]:
    """Normalise the recipe flag for ``TrlParser``: ``--recipe R`` / ``--recipe=R`` /
    ``--config=R`` all become ``--config R``. Raises ValueError when the flag has no value
    or is given twice."""
    out: list[str] = []
    it = iter(argv)
    n = 0
    for a in it:
        if a in ("--config", "--recipe") or a.startswith(("--config=", "--recipe=")):
            n += 1
            if "=" in a:
                val = a.split("=", 1)[1]
            else:
                val = next(it, None)
            if not val or val.startswith("--"):
                flag = a.split("=")[0]
                raise ConfigError(f"{flag} needs a value: it needs a YAML file path ({flag} R.yaml)")
            out += ["--config", val]
        else:
            out.append(a)
    if n > 1:
        raise ValueError("--config/--recipe given more than once")
    return out


def parse_recipe(dataclass_types: Sequence[type], argv: Sequence[str] | None, prog: str,
                        description: str, cpu_defaults: bool = True,
                        help_only: Sequence[tuple[str, str, str]] = ()) -> tuple:
    """The one recipe parser of memgym's TrlParser-configured commands (trainers, ``memgym
    eval``, ``memgym program eval``, ``memgym evolve``): parse ``argv`` (default ``sys.argv[1:]``) with
    ``trl.TrlParser`` into one instance per dataclass, in order. Values come from ``--config
    R.yaml`` (alias ``--recipe``; its ``env:`` mapping is exported), then from CLI flags. On a
    machine without CUDA, :func:`device_default_args` are applied between the two when
    ``cpu_defaults``. A dataclass's ``_argument_group_name`` heads its fields in ``--help``.
    ``help_only``: ``(flag, metavar, help)`` rows listed in ``--help`` for options the command
    takes out of ``argv`` before calling this (e.g. ``memgym evolve --resume DIR``).
    Raises ValueError for an unknown YAML key (TRL's check) or a repeated/empty ``--config``,
    FileNotFoundError for a missing recipe, IsADirectoryError for a directory; argparse exits (status 2) on a bad flag and
    (status 0) after ``--help``."""
    import argparse

    from trl import TrlParser

    args = config_argv(list(sys.argv[1:] if argv is None else argv))
    if "--config" in args:
        recipe = Path(args[args.index("--config") + 1])
        if recipe.is_dir():
            raise IsADirectoryError(21, "Is a directory; the recipe must be a YAML file", str(recipe))
        if not recipe.is_file():
            raise FileNotFoundError(f"recipe {recipe} not found")
    if cpu_defaults:
        args = device_default_args() + args
    parser = TrlParser(dataclass_types=list(dataclass_types), prog=prog, description=description)
    # listed for --help only: TrlParser reads --config itself before argparse sees the arguments
    parser.add_argument("--config", "--recipe", metavar="R.yaml", default=None,
                        help="YAML recipe whose keys set the fields below; flags given after it override it")
    for flag, metavar, text in help_only:
        parser.add_argument(flag, metavar=metavar, default=None, help=text)
    try:
        out = parser.parse_args_and_config(args=args)
    except ValueError as e:
        if "not used by the HfArgumentParser" not in str(e):
            raise
        raise ValueError(unknown_flags_message(parser, args)) from None
    return tuple(o for o in out if not isinstance(o, argparse.Namespace))


def unknown_flags_message(parser, args: Sequence[str]) -> str:
    """One line naming every ``--flag`` in ``args`` that ``parser`` does not define, each with
    its closest known flag (``difflib``, cutoff 0.6) when there is one."""
    import difflib

    known = sorted({o for a in parser._actions for o in a.option_strings})
    parts = []
    for a in args:
        if not a.startswith("--"):
            continue
        flag = a.split("=", 1)[0]
        if flag in known:
            continue
        close = difflib.get_close_matches(flag, known, n=1, cutoff=0.6)
        parts.append(flag + (f" (did you mean {close[0]}?)" if close else ""))
    return "unknown option(s): " + ", ".join(parts or ["?"]) + "; --help lists every field"
