"""Parse-time checks of memgym's settings dataclasses (the recipe sections of ``eval``,
``program eval`` and ``evolve``, the trainers' configs) and, through :func:`at_least`, of the
argparse commands (``synth``, ``reward audit``), so a bad value fails before any model loads,
with a message naming the field, the value and what is allowed. :class:`Section` is the base of
a settings section: it validates itself once, when it is built.

A class declares the rules of its own fields in a class attribute ``CHECKS = {field: {rule:
value}}`` (not in ``field(metadata=...)``: ``HfArgumentParser`` hands every metadata key to
argparse); :func:`check_fields` applies the ``CHECKS`` of every class in the MRO, so a composed
config never copies its sections' rules. Rules:

- ``"min": m``: a number >= ``m`` (``None`` only when the field's default is ``None``);
  counts use ``min: 1``, so 0 and negatives never silently mean "all" or "all but one";
- ``"choices": (...)``: one of these values (also read from the field's metadata, where
  argparse checks it for CLI values; a YAML value skips argparse, so it is checked here);
- ``"spec": "backend"``: a backend spec (``hf:``/``openai:``/``vllm:``, :func:`check_spec`);
  ``"spec": "extractor"``: a backend spec, ``expert:<file or conv-NN>[,...]`` or one of
  the rule ``"words"`` (e.g. ``("instruction",)``); on a ``list[str]`` field every item is checked;
  a rule ``"options": (...)`` allows one of these words after the spec, separated by a space
  (eval columns: ``"hf:smollm2 constrained"``); the spec before it is checked;
- ``"out_dir": True``: an output directory: must not be an existing file;
- ``"max_items": n``: a list field of a :class:`Section` holds at most ``n`` items (default
  :data:`MAX_LIST_ITEMS`).

A ``list[...]`` field given a single string (``conversations: conv-30`` in YAML) becomes a
one-element list instead of being split into characters. Every list field of a :class:`Section`
(ids, baselines, extractor columns) is bounded and deduplicated once its section is checked
(:func:`check_lists`): each item means one thing to run, so a repeat would only run it again.
Cross-field rules go through :func:`require`. Errors are :class:`ConfigError` (a ``ValueError``).
"""
from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

from memgym.llm.errors import ConfigError, OutputPathError
from memgym.llm.specs import check_spec


MAX_LIST_ITEMS = 10_000
"""The most items a recipe list field may hold unless its ``CHECKS`` say ``max_items``: above the
largest split memgym ships (LongMemEval-M, 500 question ids), far below what would exhaust a run."""


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


def out_dir_problem(path: str | Path, *, what: str, writes: str, own: Sequence[str] = (), mark: str | None = None,
                    field: str = "out") -> str:
    """Why a command must not write its outputs into the folder ``path`` ("" when it may): it is
    a file, or it holds entries other than the command's own outputs ``own``, which count as its
    own only beside ``mark``, its main output (a folder holding a user's ``report.md`` is not a
    previous run's). ``what`` names the command's outputs (``memgym score output``), ``writes``
    what it would overwrite. The one rule for ``memgym evolve``, ``score`` and ``program eval``
    (``--out /`` included: never a write into a folder of someone else's files)."""
    p = Path(path).expanduser()
    if p.exists() and not p.is_dir():
        return (f"{_flag(field)} {path}: is an existing file, not a directory; give a directory path (it is created "
                "if missing)")
    if not p.is_dir():
        return ""
    names = sorted(x.name for x in p.iterdir())
    ours = set(own) if mark is None or mark in names else set()
    others = [n for n in names if n not in ours]
    if not others:
        return ""
    shown = ", ".join(others[:5]) + (f" (+{len(others) - 5} more)" if len(others) > 5 else "")
    return f"{path} holds files but no {what} ({shown}); {writes}: choose a new or empty folder"


def check_fields(obj) -> None:
    """Apply the ``CHECKS`` rules (module docstring) of every class in ``type(obj).__mro__`` to every field of the dataclass ``obj``,
    in field order; a single string on a list field becomes a one-element list (in place).
    Raises :class:`ConfigError` naming the first bad field."""
    rules = _rules(obj)
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


def _rules(obj) -> dict:
    rules: dict = {}
    for cls in reversed(type(obj).__mro__):
        rules.update(cls.__dict__.get("CHECKS", {}))
    return rules


def check_lists(obj) -> None:
    """Bound and deduplicate every list field of the dataclass ``obj`` (in place): more than its
    ``max_items`` (default :data:`MAX_LIST_ITEMS`) items is a :class:`ConfigError` naming the field
    and the bound; repeated items are dropped, first occurrences kept in order, with a warning
    naming the field and how many were dropped."""
    import warnings

    rules = _rules(obj)
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        if not _is_list(f) or not isinstance(value, list):
            continue
        bound = rules.get(f.name, {}).get("max_items", MAX_LIST_ITEMS)
        if len(value) > bound:
            raise ConfigError(f"{_flag(f.name)}: {len(value):,} items, more than the bound of {bound:,} items per "
                              f"list")
        try:
            unique = list(dict.fromkeys(value))
        except TypeError:  # unhashable items (none of memgym's recipe lists): left as given
            continue
        if len(unique) < len(value):
            dropped = len(value) - len(unique)
            shown = ", ".join(map(str, unique[:5])) + (", ..." if len(unique) > 5 else "")
            warnings.warn(f"{_flag(f.name)}: {dropped:,} repeated item(s) dropped; each runs once, in the given order "
                          f"({shown})", stacklevel=2)
            setattr(obj, f.name, unique)


def require(obj, field: str, value, needs: str, why: str = "") -> None:
    """Cross-field rule: when ``obj.<field> == value``, ``obj.<needs>`` must be set.
    Raises :class:`ConfigError` naming both flags (e.g. ``--scorer llm needs --judge_model``)."""
    if getattr(obj, field) == value and not getattr(obj, needs):
        raise ConfigError(f"{_flag(field)} {value} needs {_flag(needs)}{' ' + why if why else ''}")


class Section:
    """Base of a settings section (a dataclass): ``__post_init__`` fills the fields left None
    from ``COMMAND_DEFAULTS`` (a class attribute ``{field: value}``, merged over the MRO, so a
    composed config sets its command's default of a field a section declares without declaring
    it again), then runs :func:`check_fields` (every class's ``CHECKS``), :meth:`check` and
    :func:`check_lists` (after :meth:`check`, which may split a comma-separated value into items),
    once, when the section or a config composed of sections is built. A section with cross-field
    rules overrides :meth:`check` and calls ``super().check()`` (cooperative, so a composed config
    runs every section's)."""

    COMMAND_DEFAULTS: dict = {}

    def __post_init__(self):
        defaults: dict = {}
        for cls in reversed(type(self).__mro__):
            defaults.update(cls.__dict__.get("COMMAND_DEFAULTS", {}))
        for name, value in defaults.items():
            if getattr(self, name) is None:
                setattr(self, name, list(value) if isinstance(value, (list, tuple)) else value)
        check_fields(self)
        self.check()
        check_lists(self)

    def check(self) -> None:
        """Cross-field rules (none here); raises :class:`ConfigError` naming the flags."""


def unknown_names_message(names: Sequence[str], known: Sequence[str], renamed: dict | None = None,
                          prefix: str = "--") -> str:
    """One line naming every unknown field in ``names``, each with the field that replaced it
    (``renamed``) or its closest known field (``difflib``, cutoff 0.6)."""
    import difflib

    parts = []
    for n in names:
        bare = n.lstrip("-").split("=", 1)[0]
        if bare in (renamed or {}):
            parts.append(f"{prefix}{bare} (now {prefix}{renamed[bare]})")
            continue
        close = difflib.get_close_matches(bare, list(known), n=1, cutoff=0.6)
        parts.append(f"{prefix}{bare}" + (f" (did you mean {prefix}{close[0]}?)" if close else ""))
    return "unknown field(s): " + ", ".join(parts) + "; --help lists every field"
