"""The memory-program contract (PrisMem, arXiv 2610.06361, appendix
"memory interface"): ONE module defining dataclasses ``MemoryUnit`` and ``Query`` with
JSON-compatible fields (:data:`memgym.memory_bank.contract.records.FIELD_KINDS`); non-empty strings
``EXTRACTION_INSTRUCTION``, ``PLANNING_INSTRUCTION``, ``ANSWER_INSTRUCTION``; and ``class Memory``
with ``__init__(self, toolkit)``, ``index(self, units, session) -> None`` and ``retrieve(self,
query) -> str`` of at most :data:`OUT_CHAR_BUDGET` characters. ``session`` is the plain dict of
:meth:`SessionInfo.to_dict`. :func:`describe_module` runs in the sandbox child; the host judges its
report with :func:`contract_from_report` and never imports candidate code.
"""
from __future__ import annotations

import dataclasses
import inspect
from dataclasses import dataclass
from typing import Any

from memgym.memory_bank.errors import ContractError
from memgym.memory_bank.contract.records import FieldSpec, dataclass_from_schema, describe_dataclass

OUT_CHAR_BUDGET = 16_000
"""Maximum length, in characters, of ``Memory.retrieve``'s output (PrisMem appendix)."""

INSTRUCTION_NAMES = ("EXTRACTION_INSTRUCTION", "PLANNING_INSTRUCTION", "ANSWER_INSTRUCTION")
REQUIRED_NAMES = ("MemoryUnit", "Query", "Memory") + INSTRUCTION_NAMES

# The required method signatures: positional parameter names after ``self``.
METHOD_PARAMS = {"__init__": ("toolkit",), "index": ("units", "session"), "retrieve": ("query",)}


@dataclass(frozen=True)
class SessionInfo:
    """The session metadata ``index`` receives: ``index`` (1-based), ``id``, ``date`` (ISO-8601 or
        None), ``date_text`` (the benchmark's own, possibly "").
        """

    index: int
    id: str
    date: str | None = None
    date_text: str = ""

    @classmethod
    def from_session(cls, session) -> "SessionInfo":
        """Build from a :class:`memgym.memory_bank.schema.Session` (turns are not included)."""
        return cls(index=session.index, id=session.id,
                   date=session.date.isoformat() if session.date is not None else None,
                   date_text=session.date_text or "")

    def to_dict(self) -> dict:
        """The JSON-compatible dict passed to ``Memory.index``."""
        return dataclasses.asdict(self)


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
    """JSON report of a loaded program module's contract surface: ``missing``, ``instructions``,
        ``schemas`` (fields or error), ``memory`` (class and method signatures). Runs in the sandbox
        child; judged by :func:`contract_from_report`.
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
