"""Recipes: the one TrlParser recipe parser (:func:`parse_recipe`: ``--config R.yaml`` plus CLI
overrides) and the parse-time field checks of the recipe dataclasses (and :func:`at_least` for
argparse commands), raising :class:`ConfigError` naming field, value and what is allowed.

A config declares ``CHECKS = {field: {rule: value}}`` (a class attribute: ``HfArgumentParser``
hands field metadata to argparse) and calls :func:`check_fields` from ``__post_init__``. Rules:
``"min": m`` (a number >= m; None only when the default is None); ``"choices": (...)`` (also
read from field metadata); ``"spec": "backend" | "extractor"`` (:func:`check_spec`, with
``"words"`` and, after a space, ``"options"``; every item of a list field); ``"out_dir": True``
(not an existing file). A single string on a ``list`` field becomes a one-element list.
Cross-field rules: :func:`require`.
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
    return f.default is None  # HfArgumentParser rewrites ``int | None`` to ``int`` in place


def _is_list(f: dataclasses.Field) -> bool:
    t = f.type if isinstance(f.type, str) else repr(f.type)
    return t.replace("typing.", "").lower().startswith("list")


def at_least(lo: float, kind: type = int):
    """An argparse ``type=`` parsing ``kind`` and rejecting values below ``lo``."""
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
    """Apply the ``CHECKS`` rules to the dataclass ``obj`` in field order (in place);
    :class:`ConfigError` names the first bad field."""
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
    """:class:`ConfigError` naming both flags when ``obj.<field> == value`` and ``obj.<needs>`` is unset."""
    if getattr(obj, field) == value and not getattr(obj, needs):
        raise ConfigError(f"{_flag(field)} {value} needs {_flag(needs)}{' ' + why if why else ''}")


def cuda_available() -> bool:
    """True when torch sees at least one CUDA device."""
    import torch

    return bool(torch.cuda.is_available())


def device_default_args(cuda: bool | None = None) -> list[str]:
    """Flags put before the user's so a TRL config runs without CUDA (``--use_cpu true --bf16
    false --fp16 false``); empty with CUDA (``cuda=None`` asks torch)."""
    cuda = cuda_available() if cuda is None else cuda
    return [] if cuda else ["--use_cpu", "true", "--bf16", "false", "--fp16", "false"]


def config_argv(argv: Sequence[str]) -> list[str]:
    """``--recipe R`` / ``--recipe=R`` / ``--config=R`` -> ``--config R``; ValueError when valueless or repeated."""
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
    """Parse ``argv`` (default ``sys.argv[1:]``) with ``trl.TrlParser`` into one instance per
    dataclass: ``--config R.yaml`` (alias ``--recipe``; its ``env:`` is exported), then
    :func:`device_default_args` without CUDA when ``cpu_defaults``, then CLI flags.
    ``help_only``: ``(flag, metavar, help)`` rows for ``--help`` only. Raises ValueError for an
    unknown key or a repeated/empty ``--config``, FileNotFoundError / IsADirectoryError for the
    recipe; argparse exits on a bad flag and after ``--help``."""
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
    """One line naming each ``--flag`` of ``args`` unknown to ``parser``, with its closest match."""

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
