"""Memory-program records: the field kinds of ``MemoryUnit`` / ``Query`` dataclasses
(:data:`FIELD_KINDS`), structured-output parsing against them, and the mapping of extractor
bank entries to units and of units/queries to text (PrisMem appendix "memory interface").
"""
from __future__ import annotations

import dataclasses
import functools
import math
import re
import types
import typing
from dataclasses import dataclass
from typing import Any

from memgym.memory_bank.errors import ContractError, StructuredOutputError

FIELD_KINDS = ("str", "int", "float", "bool", "list[str]")
"""Supported dataclass field kinds; each may also be ``Optional`` (``X | None``)."""

_KIND_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "list[str]": list[str]}


@dataclass(frozen=True)
class FieldSpec:
    """One dataclass field: ``kind`` in :data:`FIELD_KINDS`; ``optional`` allows None;
    ``required`` is False when the field has a default (``default``, a JSON value)."""

    name: str
    kind: str
    optional: bool = False
    required: bool = True
    default: Any = None

    def python_type(self) -> Any:
        t = _KIND_TYPES[self.kind]
        return typing.Optional[t] if self.optional else t

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "FieldSpec":  # a report from the sandbox child
        if not isinstance(d, dict) or d.get("kind") not in FIELD_KINDS or not isinstance(d.get("name"), str):
            raise ContractError(f"malformed field spec {d!r}")
        return cls(name=d["name"], kind=d["kind"], optional=bool(d.get("optional")),
                   required=bool(d.get("required", True)), default=d.get("default"))


def _kind_of(tp: Any) -> tuple[str, bool] | None:
    """(kind, optional) for a supported annotation, else None."""
    optional = False
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) != 1 or len(typing.get_args(tp)) != 2:
            return None
        tp, optional = args[0], True
    if tp in (str, int, float, bool):
        return tp.__name__, optional
    if typing.get_origin(tp) is list and typing.get_args(tp) == (str,):
        return "list[str]", optional
    return None


def _json_value_ok(v: Any, kind: str, optional: bool) -> bool:
    if v is None:
        return optional
    if kind == "list[str]":
        return isinstance(v, list) and all(isinstance(x, str) for x in v)
    if kind == "float":
        return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
    if kind == "int":
        return isinstance(v, int) and not isinstance(v, bool)
    return isinstance(v, _KIND_TYPES[kind])


def describe_dataclass(cls: Any) -> list[FieldSpec]:
    """The field specs of a program dataclass, in order. Raises :class:`ContractError` (level 2) for
    a non-dataclass, no fields, an unsupported field type or a default of the wrong type.
    """
    name = getattr(cls, "__name__", repr(cls))
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise ContractError(f"{name} must be a dataclass (decorate it with @dataclass)")
    try:
        hints = typing.get_type_hints(cls)
    except Exception as e:  # unresolvable string annotation
        raise ContractError(f"{name}: cannot resolve field annotations: {type(e).__name__}: {e}") from None
    specs = []
    for f in dataclasses.fields(cls):
        kind = _kind_of(hints.get(f.name))
        if kind is None:
            raise ContractError(f"{name}.{f.name}: unsupported type {hints.get(f.name)!r}; "
                                f"use one of {', '.join(FIELD_KINDS)} or Optional of these")
        required, default = True, None
        if f.default is not dataclasses.MISSING:
            required, default = False, f.default
        elif f.default_factory is not dataclasses.MISSING:
            required = False
            try:
                default = f.default_factory()
            except Exception as e:
                raise ContractError(f"{name}.{f.name}: default_factory raised {type(e).__name__}: {e}") from None
        if not required and not _json_value_ok(default, *kind):
            raise ContractError(f"{name}.{f.name}: default {default!r} is not a valid {kind}"
                                + (" or None" if kind[1] else ""))
        specs.append(FieldSpec(f.name, kind[0], kind[1], required, default))
    if not specs:
        raise ContractError(f"{name} must declare at least one field")
    return specs


def dataclass_from_schema(name: str, fields: list[FieldSpec]) -> type:
    """A host-side dataclass equivalent to a program's (used so that the host never imports
    untrusted code). Field order, types, optionality and defaults are preserved."""
    defs = []
    for f in sorted(fields, key=lambda f: not f.required):  # dataclasses need defaults last
        if f.required:
            defs.append((f.name, f.python_type()))
        else:
            val = f.default
            defs.append((f.name, f.python_type(), dataclasses.field(
                default_factory=(lambda v=val: list(v)) if isinstance(val, list) else (lambda v=val: v))))
    return dataclasses.make_dataclass(name, defs)


@functools.lru_cache(maxsize=128)
def _validator(cls: type):
    import pydantic
    specs = describe_dataclass(cls)
    cfg = pydantic.ConfigDict(extra="forbid", allow_inf_nan=False, coerce_numbers_to_str=True)
    fields = {f.name: (f.python_type(), ... if f.required else f.default) for f in specs}
    return pydantic.create_model(f"{cls.__name__}Validator", __config__=cfg, **fields)


def coerce_record(record: Any, cls: type, *, index: int | None = None) -> Any:
    """One instance of ``cls`` from a JSON object (numbers/strings/bools coerced where lossless).
    Raises :class:`StructuredOutputError` naming the field.
    """
    import pydantic
    schema = cls.__name__
    if not isinstance(record, dict):
        raise StructuredOutputError(f"expected a JSON object, got {type(record).__name__}", schema=schema, index=index)
    try:
        obj = _validator(cls).model_validate(record)
    except pydantic.ValidationError as e:
        err = e.errors()[0]
        field = ".".join(str(x) for x in err["loc"]) or None
        extra = f" (and {e.error_count() - 1} more)" if e.error_count() > 1 else ""
        raise StructuredOutputError(f"{err['msg']}{extra}", schema=schema, field=field, index=index) from None
    return cls(**obj.model_dump())


def parse_structured(text: str | Any, cls: type, *, many: bool | None = None) -> Any:
    """``cls`` instance(s) from a model's output (repaired by ``json_repair``) or a decoded value.
    ``many``: True a list (a lone object or a one-key wrapper unwrapped), False one object, None
    as given. Raises :class:`StructuredOutputError` (field and index) and :class:`ContractError`.
    """
    import json_repair
    schema = getattr(cls, "__name__", "?")
    data = text
    if isinstance(text, str):
        if not text.strip():
            raise StructuredOutputError("empty output", schema=schema)
        data = json_repair.repair_json(text, return_objects=True)
        if data == "" or not isinstance(data, (dict, list)):
            raise StructuredOutputError(f"no JSON object or list found in output {text[:80]!r}", schema=schema)
    if many is None:
        many = isinstance(data, list)
    if not many:
        if isinstance(data, list) and len(data) == 1:
            data = data[0]
        return coerce_record(data, cls)
    if isinstance(data, dict):
        lists = [v for v in data.values() if isinstance(v, list)]
        data = lists[0] if len(data) == 1 and len(lists) == 1 else [data]
    if not isinstance(data, list):
        raise StructuredOutputError(f"expected a JSON list, got {type(data).__name__}", schema=schema)
    return [coerce_record(r, cls, index=i) for i, r in enumerate(data)]


# entry key -> unit field names that can carry it, in preference order
_ENTRY_FIELDS = {"text": ("content", "text"), "part": ("part",), "id": ("entry_id", "id"),
                 "date": ("date",), "session": ("session",), "deleted": ("deleted",)}


def units_from_entries(entries: list[dict], unit_cls: type) -> list:
    """Program units from extractor bank entries ``{"part", "id", "text", "date", "session"[,
    "deleted"]}``, mapped onto the unit fields that exist (deleted entries dropped without a
    ``deleted`` field). Raises :class:`StructuredOutputError` naming the entry and field.
    """
    names = {f.name for f in describe_dataclass(unit_cls)}
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise StructuredOutputError(f"entry must be a dict, got {type(e).__name__}", schema="entry", index=i)
        if e.get("deleted") and "deleted" not in names:
            continue
        if not isinstance(e.get("text"), str):
            raise StructuredOutputError("missing or non-string 'text'", schema="entry", field="text", index=i)
        rec = {}
        for key, candidates in _ENTRY_FIELDS.items():
            target = next((c for c in candidates if c in names), None)
            if target is not None and e.get(key) is not None:
                rec[target] = e[key]
        out.append(coerce_record(rec, unit_cls, index=i))
    return out


def schema_hint(fields: tuple[FieldSpec, ...] | list[FieldSpec]) -> str:
    """``"content" (str), "date" (str or null, optional)`` for a program dataclass schema."""
    parts = []
    for f in fields:
        t = f.kind + (" or null" if f.optional else "")
        parts.append(f'"{f.name}" ({t}{"" if f.required else ", optional"})')
    return ", ".join(parts)


TEXT_FIELD_NAMES = ("content", "text", "memory", "fact", "summary", "statement")
"""Unit fields, in preference order, taken as a unit's text by :func:`unit_text`."""

QUERY_FIELD_HINTS = ("query", "search", "text", "question")
"""Name fragments, in preference order, that mark the Query field a plain text goes into."""


def unit_text(unit: dict, fields: tuple[FieldSpec, ...] | list[FieldSpec]) -> str:
    """A unit's text: the first non-empty field of :data:`TEXT_FIELD_NAMES`, else the first
    non-empty str field, else the ``list[str]`` values joined by ", ", else "".
    """
    for name in TEXT_FIELD_NAMES:
        v = unit.get(name)
        if isinstance(v, str) and v.strip():
            return v
    for f in fields:
        v = unit.get(f.name)
        if f.kind == "str" and isinstance(v, str) and v.strip():
            return v
    lists = [", ".join(unit[f.name]) for f in fields if f.kind == "list[str]" and isinstance(unit.get(f.name), list)]
    return ", ".join(x for x in lists if x)


def text_query(fields: tuple[FieldSpec, ...] | list[FieldSpec], text: str) -> dict | None:
    """A Query carrying ``text`` in its first str field matching :data:`QUERY_FIELD_HINTS` (else the
    first str, else the first list[str] field as ``[text]``), other fields at their defaults or
    neutral values; None when no field can carry text.
    """
    strs = [f for f in fields if f.kind == "str"]
    target = next((f for hint in QUERY_FIELD_HINTS for f in strs if hint in f.name.lower()), None)
    target = target or (strs[0] if strs else next((f for f in fields if f.kind == "list[str]"), None))
    if target is None:
        return None
    neutral = {"str": "", "int": 0, "float": 0.0, "bool": False, "list[str]": []}
    rec = {}
    for f in fields:
        if f is target:
            rec[f.name] = [text] if f.kind == "list[str]" else text
        elif not f.required:
            rec[f.name] = list(f.default) if isinstance(f.default, list) else f.default
        else:
            rec[f.name] = None if f.optional else neutral[f.kind]
    return rec


_LEADING_DATE = re.compile(r"^\s*(\d{4}(?:-\d{2}(?:-\d{2})?)?)\s*:")


def session_entries(before: dict | None, after: dict, session_index: int, session_date: str | None,
                    *, deletions: bool = False) -> list[dict]:
    """``[{"part", "id", "text", "date", "session"}]``: the entries updated in ``session_index``
    between bank JSON ``before`` (None = empty) and ``after``, episodic/semantic/procedural in
    bank order, plus ``core`` when its text changed. ``date``: an episodic entry's leading date,
    else ``session_date``. ``deletions``: also removed entries and an emptied core, with
    ``"deleted": True``.
    """
    from memgym.memory_bank.actions import PARTS  # host side only: keeps pydantic out of the sandbox child's imports

    out = []
    old_core = (before or {}).get("core", "")
    if after.get("core", "") and after.get("core", "") != old_core:
        out.append({"part": "core", "id": "core", "text": after["core"], "date": session_date,
                    "session": session_index})
    for part in PARTS:
        for e in after.get(part, []):
            if int(e.get("updated", -1)) != session_index:
                continue
            m = _LEADING_DATE.match(e["text"]) if part == "episodic" else None
            out.append({"part": part, "id": e["id"], "text": e["text"], "date": m.group(1) if m else session_date,
                        "session": session_index})
    if deletions:
        if old_core and not after.get("core", ""):
            out.append({"part": "core", "id": "core", "text": "", "date": session_date, "session": session_index,
                        "deleted": True})
        for part in PARTS:
            live = {e["id"] for e in after.get(part, [])}
            out += [{"part": part, "id": e["id"], "text": "", "date": session_date, "session": session_index,
                     "deleted": True} for e in (before or {}).get(part, []) if e["id"] not in live]
    return out


def turn_entries(session) -> list[dict]:
    """One entry per dialogue turn of a session (``"speaker: text"``, caption appended as
    ``[image: caption]``); turns with neither text nor caption are skipped.
    """
    date = session.date.date().isoformat() if session.date else None
    out = []
    for t in session.turns:
        text = (t.text or "").strip()
        if t.image_caption:
            text = f"{text} [image: {t.image_caption}]".strip()
        if text:
            out.append({"part": "turn", "id": t.id, "text": f"{t.speaker}: {text}", "date": date,
                        "session": session.index})
    return out
