"""JSON schemas of a memory program's records for constrained instruction extraction
(``{"units": [MemoryUnit, ...]}``) and planning (one Query), from the program's dataclasses
(:func:`memgym.memory_bank.contract.describe_dataclass`): str/int/float/bool/list[str], Optional adding
``null``; every field required and no other key (OpenAI strict mode). Cached per field list.
"""
from __future__ import annotations

import functools
import json

from memgym.llm.structured import JsonSchema

_JSON_TYPE = {"str": {"type": "string"}, "int": {"type": "integer"}, "float": {"type": "number"},
              "bool": {"type": "boolean"}, "list[str]": {"type": "array", "items": {"type": "string"}}}


def _fields_key(fields) -> str:
    return json.dumps([f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in fields], sort_keys=True)


def record_schema(fields) -> dict:
    """The JSON schema (a dict) of one record with these :class:`FieldSpec` fields.
    Raises ValueError for an empty field list or an unknown kind."""
    fields = [f.to_dict() if hasattr(f, "to_dict") else dict(f) for f in fields]
    if not fields:
        raise ValueError("a record schema needs at least one field")
    props = {}
    for f in fields:
        if f["kind"] not in _JSON_TYPE:
            raise ValueError(f"field {f['name']!r}: unknown kind {f['kind']!r}; expected one of {sorted(_JSON_TYPE)}")
        t = dict(_JSON_TYPE[f["kind"]])
        props[f["name"]] = {"anyOf": [t, {"type": "null"}]} if f.get("optional") else t
    return {"type": "object", "properties": props, "required": [f["name"] for f in fields],
            "additionalProperties": False}


@functools.lru_cache(maxsize=256)
def _units_schema(key: str) -> JsonSchema:
    unit = record_schema(json.loads(key))
    return JsonSchema("memory_units", {"type": "object", "properties": {"units": {"type": "array", "items": unit}},
                                       "required": ["units"], "additionalProperties": False})


@functools.lru_cache(maxsize=256)
def _query_schema(key: str) -> JsonSchema:
    return JsonSchema("query", record_schema(json.loads(key)))


def units_schema(unit_fields) -> JsonSchema:
    """Schema of an instruction-extraction answer: ``{"units": [MemoryUnit, ...]}``."""
    return _units_schema(_fields_key(unit_fields))


def query_schema(query_fields) -> JsonSchema:
    """Schema of a planning answer: one Query object."""
    return _query_schema(_fields_key(query_fields))
