"""The memory-program contract: what an (evolved) memory program defines, the toolkit it may
use, structured-output parsing against its schemas, and loading.

Source: ``DESIGN.md`` § "Memory programs and capability-driven evolution" and the PrisMem
paper (``shared/seeds/000_0e559b88b400976a.txt``, appendix "memory interface" and "execution
checks"). A memory program is ONE Python module defining:

- dataclasses ``MemoryUnit`` and ``Query`` whose fields are JSON-compatible: ``str``, ``int``,
  ``float``, ``bool``, ``list[str]`` or ``Optional`` of these (see :data:`FIELD_KINDS`);
- non-empty strings ``EXTRACTION_INSTRUCTION``, ``PLANNING_INSTRUCTION``, ``ANSWER_INSTRUCTION``;
- ``class Memory`` with ``__init__(self, toolkit)``, ``index(self, units, session) -> None`` and
  ``retrieve(self, query) -> str`` returning at most :data:`OUT_CHAR_BUDGET` characters.

Components: Extraction = EXTRACTION_INSTRUCTION + MemoryUnit; Indexing = Memory.__init__/index
(+ module-level helpers); Planning = PLANNING_INSTRUCTION + Query; Retrieval = Memory.retrieve;
Answer = ANSWER_INSTRUCTION. The host-side runner extracts units (:func:`parse_structured` of
the task LLM's output, or :func:`units_from_entries` of a trained extractor's bank entries),
calls ``index``, plans a ``Query``, calls ``retrieve`` and answers.

``session`` (the second argument of ``index``) is a **plain dict** ``{"index": int, "id": str,
"date": ISO-8601 str | None, "date_text": str}`` built by :meth:`SessionInfo.to_dict`. A dict
(not a class) is passed so that the value is identical in-process and across the sandbox's
JSON pipe, and programs need no import to read it.

Candidate programs may only import an allow-listed set of modules, so this module is never
imported BY programs; the sandbox child imports it to build the toolkit it hands them.
"""
from __future__ import annotations

import dataclasses
import functools
import importlib.util
import inspect
import math
import sys
import types
import typing
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

OUT_CHAR_BUDGET = 16_000
"""Maximum length, in characters, of ``Memory.retrieve``'s output (PrisMem appendix)."""

INSTRUCTION_NAMES = ("EXTRACTION_INSTRUCTION", "PLANNING_INSTRUCTION", "ANSWER_INSTRUCTION")
REQUIRED_NAMES = ("MemoryUnit", "Query", "Memory") + INSTRUCTION_NAMES

FIELD_KINDS = ("str", "int", "float", "bool", "list[str]")
"""Supported dataclass field kinds; each may also be ``Optional`` (``X | None``)."""

_KIND_TYPES: dict[str, Any] = {"str": str, "int": int, "float": float, "bool": bool, "list[str]": list[str]}

# The required method signatures: positional parameter names after ``self``.
METHOD_PARAMS = {"__init__": ("toolkit",), "index": ("units", "session"), "retrieve": ("query",)}


class ProgramError(Exception):
    """Base class of memory-program contract errors."""


class ContractError(ProgramError):
    """A program breaks the contract. ``level`` is the PrisMem validation level that catches
    it: 1 = a required name is missing, 2 = a schema or signature is incompatible."""

    def __init__(self, message: str, level: int = 2):
        super().__init__(message)
        self.level = level


class StructuredOutputError(ProgramError, ValueError):
    """A structured model output (or host data) does not fit a program's dataclass schema.

    ``schema`` names the dataclass, ``field`` the offending field (None when the whole output is
    wrong, e.g. not JSON), ``index`` the list position for list outputs (else None).
    """

    def __init__(self, message: str, *, schema: str, field: str | None = None, index: int | None = None):
        where = schema + (f"[{index}]" if index is not None else "") + (f".{field}" if field else "")
        super().__init__(f"{where}: {message}")
        self.schema, self.field, self.index = schema, field, index


class ToolkitError(ProgramError):
    """A toolkit call was malformed (wrong argument types/sizes) or its host failed."""


class BudgetExceededError(ToolkitError):
    """A toolkit call would exceed the program's call budget (``kind`` is "llm" or "embed")."""

    def __init__(self, message: str, kind: str):
        super().__init__(message)
        self.kind = kind


# --------------------------------------------------------------------------- sessions


@dataclass(frozen=True)
class SessionInfo:
    """The session metadata a program's ``index`` receives (as ``to_dict()``).

    index: 1-based session index; id: session id; date: ISO-8601 date-time string or None;
    date_text: the benchmark's own date text ("1:56 pm on 8 May, 2023"), possibly "".
    """

    index: int
    id: str
    date: str | None = None
    date_text: str = ""

    @classmethod
    def from_session(cls, session) -> "SessionInfo":
        """Build from a :class:`memory_bank.schema.Session` (turns are not included)."""
        return cls(index=session.index, id=session.id,
                   date=session.date.isoformat() if session.date is not None else None,
                   date_text=session.date_text or "")

    def to_dict(self) -> dict:
        """The JSON-compatible dict passed to ``Memory.index``."""
        return dataclasses.asdict(self)


# --------------------------------------------------------------------------- schemas


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
    """The field specs of a program dataclass, in declaration order.

    Raises :class:`ContractError` (level 2) if ``cls`` is not a dataclass, has no fields, has a
    field of an unsupported type (naming the field and its annotation), or a default that is
    not a JSON value of the field's type. ``default_factory`` fields are called once.
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
    """Validate one JSON object against dataclass ``cls`` and build an instance.

    Numbers are accepted for strings, numeric strings for numbers, "true"/"false" for bools;
    NaN/inf, missing required fields, unknown fields and wrong types raise
    :class:`StructuredOutputError` naming the field.
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
    """Parse a model's structured output into ``cls`` instance(s).

    ``text`` is the raw model output (code fences, surrounding prose and small JSON damage are
    repaired by ``json_repair``) or an already-decoded JSON value. ``many=True`` returns a list
    (a bare object counts as a one-element list; an object with exactly one key whose value is
    a list, e.g. ``{"units": [...]}``, is unwrapped); ``many=False`` requires one object;
    ``None`` returns a list iff the output is a list. Raises :class:`StructuredOutputError`
    (naming the field and list index) and :class:`ContractError` if ``cls`` is not a valid
    program dataclass.
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
                 "date": ("date",), "session": ("session",)}


def units_from_entries(entries: list[dict], unit_cls: type) -> list:
    """Turn a trained extractor's bank entries into program units (``extractor`` extraction).

    Each entry is ``{"part": str, "id": str, "text": str, "date": str|None, "session": int}``;
    ``text`` is required, the rest optional. Values go to the unit fields that exist:
    text -> ``content`` (else ``text``), id -> ``entry_id`` (else ``id``), part, date, session.
    Raises :class:`StructuredOutputError` naming the entry index and field when an entry is
    not a dict, lacks ``text``, or a value does not fit the field's type, or when the unit has
    a required field no entry key maps to.
    """
    names = {f.name for f in describe_dataclass(unit_cls)}
    out = []
    for i, e in enumerate(entries):
        if not isinstance(e, dict):
            raise StructuredOutputError(f"entry must be a dict, got {type(e).__name__}", schema="entry", index=i)
        if not isinstance(e.get("text"), str):
            raise StructuredOutputError("missing or non-string 'text'", schema="entry", field="text", index=i)
        rec = {}
        for key, candidates in _ENTRY_FIELDS.items():
            target = next((c for c in candidates if c in names), None)
            if target is not None and e.get(key) is not None:
                rec[target] = e[key]
        out.append(coerce_record(rec, unit_cls, index=i))
    return out


# --------------------------------------------------------------------------- toolkit


@runtime_checkable
class ToolkitHost(Protocol):
    """What serves a program's toolkit calls (host side; in the sandbox it is proxied).

    ``embed(texts)`` returns an array-like of shape (len(texts), dim), rows L2-normalised;
    ``llm(prompt, max_tokens)`` returns the task LLM's completion text (max_tokens in tokens).
    """

    def embed(self, texts: list[str]) -> Any: ...

    def llm(self, prompt: str, max_tokens: int) -> str: ...


class BackendToolkitHost:
    """Adapter from memgym's ``llm.base`` Backend + Embedder to :class:`ToolkitHost`.

    ``llm`` sends one user message with greedy decoding and ``max_new_tokens=max_tokens``.
    """

    def __init__(self, backend, embedder):
        self.backend, self.embedder = backend, embedder

    def embed(self, texts: list[str]) -> np.ndarray:
        return self.embedder.encode(list(texts))

    def llm(self, prompt: str, max_tokens: int) -> str:
        from llm.base import GenerationParams
        params = GenerationParams(max_new_tokens=max_tokens)
        return self.backend.generate([[{"role": "user", "content": prompt}]], params)[0].text


class Toolkit:
    """What a memory program may use inside ``Memory`` (``toolkit`` in ``__init__``).

    - ``embed(texts) -> list[list[float]]``: one vector per text, L2-normalised, (n, dim);
    - ``llm(prompt, max_tokens=256) -> str``: the task LLM; each call spends one unit of
      ``budget``; exceeding it raises :class:`BudgetExceededError`;
    - ``budget``: remaining llm calls; ``embed_budget``: remaining embed calls (None = no cap);
    - pure helpers :meth:`cosine_topk` and :meth:`truncate`; ``OUT_CHAR_BUDGET``.

    Argument limits (``max_embed_texts`` texts per call, ``max_text_chars`` characters per text
    or prompt, ``max_llm_tokens`` tokens) raise :class:`ToolkitError`. ``calls`` counts
    successful calls: {"llm": n, "embed": n, "embed_texts": n, "refused": n}.
    """

    OUT_CHAR_BUDGET = OUT_CHAR_BUDGET

    def __init__(self, host: ToolkitHost, *, llm_budget: int = 0, embed_budget: int | None = None,
                 max_embed_texts: int = 4096, max_text_chars: int = 100_000, max_llm_tokens: int = 2048):
        self._host = host
        self._llm_left = int(llm_budget)
        self._embed_left = None if embed_budget is None else int(embed_budget)
        self.max_embed_texts, self.max_text_chars, self.max_llm_tokens = max_embed_texts, max_text_chars, max_llm_tokens
        self.calls = {"llm": 0, "embed": 0, "embed_texts": 0, "refused": 0}

    budget = property(lambda self: self._llm_left, doc="Remaining llm calls (int >= 0).")
    embed_budget = property(lambda self: self._embed_left, doc="Remaining embed calls, or None = no cap.")

    def _check_texts(self, texts: Any) -> list[str]:
        if isinstance(texts, str) or not isinstance(texts, (list, tuple)):
            raise ToolkitError(f"embed(texts) needs a list of str, got {type(texts).__name__}")
        if len(texts) > self.max_embed_texts:
            raise ToolkitError(f"embed: {len(texts)} texts > max {self.max_embed_texts} per call")
        for i, t in enumerate(texts):
            if not isinstance(t, str):
                raise ToolkitError(f"embed: texts[{i}] is {type(t).__name__}, not str")
            if len(t) > self.max_text_chars:
                raise ToolkitError(f"embed: texts[{i}] has {len(t)} chars > max {self.max_text_chars}")
        return list(texts)

    def embed_array(self, texts: list[str]) -> np.ndarray:
        """Like :meth:`embed` but returns a float32 array (n, dim). Host output that is not
        (n, dim) finite numbers raises :class:`ToolkitError`; rows are re-normalised."""
        texts = self._check_texts(texts)
        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        if self._embed_left is not None and self._embed_left <= 0:
            self.calls["refused"] += 1
            raise BudgetExceededError("embed call budget exhausted", "embed")
        arr = np.asarray(self._host.embed(texts), dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] != len(texts) or not np.isfinite(arr).all():
            raise ToolkitError(f"embedder returned shape {arr.shape} for {len(texts)} texts (or non-finite values)")
        norms = np.linalg.norm(arr, axis=1, keepdims=True)
        arr = arr / np.where(norms > 0, norms, 1.0)
        if self._embed_left is not None:
            self._embed_left -= 1
        self.calls["embed"] += 1
        self.calls["embed_texts"] += len(texts)
        return arr

    def embed(self, texts: list[str]) -> list[list[float]]:
        """Embed ``texts``: a list of L2-normalised vectors (n × dim floats); [] for []."""
        return self.embed_array(texts).tolist()

    def llm(self, prompt: str, max_tokens: int = 256) -> str:
        """One task-LLM completion of ``prompt`` (at most ``max_tokens`` tokens)."""
        if not isinstance(prompt, str):
            raise ToolkitError(f"llm(prompt) needs a str, got {type(prompt).__name__}")
        if len(prompt) > self.max_text_chars:
            raise ToolkitError(f"llm: prompt has {len(prompt)} chars > max {self.max_text_chars}")
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or not 1 <= max_tokens <= self.max_llm_tokens:
            raise ToolkitError(f"llm: max_tokens must be an int in [1, {self.max_llm_tokens}], got {max_tokens!r}")
        if self._llm_left <= 0:
            self.calls["refused"] += 1
            raise BudgetExceededError("llm call budget exhausted", "llm")
        out = self._host.llm(prompt, max_tokens)
        if not isinstance(out, str):
            raise ToolkitError(f"llm host returned {type(out).__name__}, not str")
        self._llm_left -= 1
        self.calls["llm"] += 1
        return out

    @staticmethod
    def cosine_topk(query_vec: Any, matrix: Any, k: int) -> list[tuple[int, float]]:
        """Top-``k`` rows of ``matrix`` (n, dim) by cosine with ``query_vec`` (dim,).

        Returns ``[(row_index, cosine), ...]`` best first (ties by lower index), at most
        ``min(k, n)`` pairs; cosines in [-1, 1]. Zero vectors score 0. A dimension mismatch
        raises :class:`ToolkitError`.
        """
        q = np.asarray(query_vec, dtype=np.float32).reshape(-1)
        m = np.asarray(matrix, dtype=np.float32)
        if m.size == 0 or k <= 0:
            return []
        if m.ndim != 2 or m.shape[1] != q.shape[0]:
            raise ToolkitError(f"cosine_topk: matrix shape {m.shape} does not match query dim {q.shape[0]}")
        denom = np.linalg.norm(m, axis=1) * (np.linalg.norm(q) or 1.0)
        sims = (m @ q) / np.where(denom > 0, denom, 1.0)
        order = np.argsort(-sims, kind="stable")[:k]
        return [(int(i), float(np.clip(sims[i], -1.0, 1.0))) for i in order]

    @staticmethod
    def truncate(text: str, limit: int = OUT_CHAR_BUDGET) -> str:
        """``text`` cut to at most ``limit`` characters."""
        return text[:limit]


# --------------------------------------------------------------------------- modules


def _signature(fn: Any) -> dict:
    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError) as e:
        return {"error": f"{type(e).__name__}: {e}"}
    params = [{"name": p.name, "kind": p.kind.name, "has_default": p.default is not inspect.Parameter.empty}
              for p in sig.parameters.values()]
    return {"params": params, "async": inspect.iscoroutinefunction(fn) or inspect.isasyncgenfunction(fn),
            "generator": inspect.isgeneratorfunction(fn)}


def describe_module(module: Any) -> dict:
    """A JSON-compatible report of a loaded program module's contract surface.

    Keys: ``missing`` (required names absent), ``instructions`` {name: {"type", "value"}},
    ``schemas`` {"MemoryUnit"/"Query": {"fields": [FieldSpec dict]} or {"error": str}},
    ``memory`` {"is_class": bool, "methods": {name: signature report or None}}. Runs in the
    sandbox child; judge it with :func:`contract_from_report`.
    """
    ns = vars(module)
    rep: dict = {"missing": [n for n in REQUIRED_NAMES if n not in ns], "instructions": {}, "schemas": {}, "memory": {}}
    for n in INSTRUCTION_NAMES:
        if n in ns:
            v = ns[n]
            rep["instructions"][n] = {"type": type(v).__name__, "value": v if isinstance(v, str) else None}
    for n in ("MemoryUnit", "Query"):
        if n in ns:
            try:
                rep["schemas"][n] = {"fields": [f.to_dict() for f in describe_dataclass(ns[n])]}
            except ContractError as e:
                rep["schemas"][n] = {"error": str(e)}
    mem = ns.get("Memory")
    if mem is not None:
        rep["memory"]["is_class"] = isinstance(mem, type)
        rep["memory"]["methods"] = {m: (_signature(getattr(mem, m)) if isinstance(mem, type) and callable(getattr(mem, m, None)) else None)
                                    for m in METHOD_PARAMS}
    return rep


@dataclass(frozen=True)
class ProgramInfo:
    """What the host needs from a validated program: unit/query schemas and instructions."""

    unit_fields: tuple[FieldSpec, ...]
    query_fields: tuple[FieldSpec, ...]
    extraction_instruction: str
    planning_instruction: str
    answer_instruction: str

    def unit_class(self) -> type:
        """A host-side dataclass with the program's MemoryUnit schema (for parse_structured);
        built once per ProgramInfo."""
        if "_unit_cls" not in self.__dict__:  # frozen: cache via __dict__, outside eq/repr
            self.__dict__["_unit_cls"] = dataclass_from_schema("MemoryUnit", list(self.unit_fields))
        return self.__dict__["_unit_cls"]

    def query_class(self) -> type:
        """A host-side dataclass with the program's Query schema; built once per ProgramInfo."""
        if "_query_cls" not in self.__dict__:
            self.__dict__["_query_cls"] = dataclass_from_schema("Query", list(self.query_fields))
        return self.__dict__["_query_cls"]


def _check_method(name: str, rep: dict | None) -> None:
    want = METHOD_PARAMS[name]
    if rep is None:
        raise ContractError(f"Memory.{name} is missing or not callable")
    if "error" in rep:
        raise ContractError(f"Memory.{name}: cannot read signature ({rep['error']})")
    if rep.get("async") or rep.get("generator"):
        raise ContractError(f"Memory.{name} must be a plain synchronous method (not async/generator)")
    params = rep["params"]
    if not params or params[0]["name"] != "self" or params[0]["kind"] != "POSITIONAL_OR_KEYWORD":
        raise ContractError(f"Memory.{name} must be an instance method taking self first")
    rest = params[1:]
    positional = [p for p in rest if p["kind"] in ("POSITIONAL_ONLY", "POSITIONAL_OR_KEYWORD")]
    got = tuple(p["name"] for p in positional[: len(want)])
    if len(positional) < len(want) and not any(p["kind"] == "VAR_POSITIONAL" for p in rest):
        raise ContractError(f"Memory.{name} must accept ({', '.join(('self',) + want)}); got params {[p['name'] for p in params]}")
    extra_required = [p["name"] for p in rest if not p["has_default"] and p["kind"] not in ("VAR_POSITIONAL", "VAR_KEYWORD")
                      and p not in positional[: len(want)]]
    if extra_required:
        raise ContractError(f"Memory.{name} has extra required parameters {extra_required} (want {want}, got {got})")


def contract_from_report(report: dict) -> ProgramInfo:
    """Judge a :func:`describe_module` report. Raises :class:`ContractError` with ``level=1``
    for missing names and ``level=2`` for schema / instruction / signature problems."""
    if report.get("missing"):
        raise ContractError(f"program does not define {', '.join(report['missing'])}", level=1)
    instr = {}
    for n in INSTRUCTION_NAMES:
        r = report["instructions"][n]
        if r["type"] != "str" or not (r["value"] or "").strip():
            raise ContractError(f"{n} must be a non-empty str (got {r['type']}{'' if r['type'] != 'str' else ' that is empty'})")
        instr[n] = r["value"]
    schemas = {}
    for n in ("MemoryUnit", "Query"):
        r = report["schemas"][n]
        if "error" in r:
            raise ContractError(r["error"])
        schemas[n] = tuple(FieldSpec.from_dict(f) for f in r["fields"])
    if not report["memory"].get("is_class"):
        raise ContractError("Memory must be a class")
    for m in METHOD_PARAMS:
        _check_method(m, report["memory"]["methods"].get(m))
    return ProgramInfo(schemas["MemoryUnit"], schemas["Query"], instr["EXTRACTION_INSTRUCTION"],
                       instr["PLANNING_INSTRUCTION"], instr["ANSWER_INSTRUCTION"])


def load_program_module(path: str | Path, module_name: str | None = None) -> types.ModuleType:
    """Import a TRUSTED program file in-process (seed/reference, tests). Untrusted candidates
    must go through ``evolution.execution.sandbox.SandboxedProgram`` instead. The module is registered
    in ``sys.modules`` under ``module_name`` (default ``memgym_program_<stem>``) so that
    ``typing.get_type_hints`` can resolve its annotations. Raises FileNotFoundError naming
    the path."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"memory program not found: {path}")
    name = module_name or f"memgym_program_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module
