"""Structured outputs: ``Backend.generate(..., schemas=[JsonSchema | None, ...])`` constrains each
conversation to a JSON schema (hf: llguidance grammar; vllm: structured-output sampling; openai:
``response_format``). An inference option only, never for RL rollouts."""
from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from memgym.llm.base import BackendRequestError

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ConstraintRefusedError(BackendRequestError):
    """A server refused a JSON-schema ``response_format`` (never a silent fallback to free generation)."""


@dataclass(frozen=True, eq=False)
class JsonSchema:
    """A named JSON schema: ``name`` 1-64 of ``[A-Za-z0-9_-]`` (OpenAI's rule); ``schema`` a dict;
    ``canonical`` its compact JSON in key order (property order is part of the grammar) and
    ``digest`` 16 hex of its sha256 (equality, cache keys). ValueError for a bad name or schema."""

    name: str
    schema: Mapping
    canonical: str = field(init=False, repr=False)
    digest: str = field(init=False)

    def __post_init__(self):
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(f"JsonSchema name must match [A-Za-z0-9_-]{{1,64}}, got {self.name!r}")
        if not isinstance(self.schema, Mapping):
            raise ValueError(f"JsonSchema {self.name}: schema must be a dict, got {type(self.schema).__name__}")
        canonical = json.dumps(self.schema, separators=(",", ":"), ensure_ascii=False)
        object.__setattr__(self, "canonical", canonical)
        object.__setattr__(self, "digest", hashlib.sha256(canonical.encode("utf-8")).hexdigest()[:16])

    def __eq__(self, other):
        return isinstance(other, JsonSchema) and other.name == self.name and other.digest == self.digest

    def __hash__(self):
        return hash((self.name, self.digest))

    def as_dict(self) -> dict:
        """A deep copy of the schema (safe to mutate, e.g. by a client library)."""
        return copy.deepcopy(dict(self.schema))

    def response_format(self) -> dict:
        """The OpenAI Chat Completions ``response_format`` for this schema (``strict`` mode)."""
        return {"type": "json_schema", "json_schema": {"name": self.name, "schema": self.as_dict(), "strict": True}}


def closed_schema(schema: dict) -> dict:
    """A copy of a pydantic JSON schema fit for strict constrained decoding: objects get
    ``additionalProperties: false``, ``oneOf`` becomes ``anyOf``, ``discriminator`` is dropped."""
    def walk(node):
        if isinstance(node, list):
            return [walk(x) for x in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for k, v in node.items():
            if k == "discriminator":
                continue
            out["anyOf" if k == "oneOf" else k] = walk(v) if k not in ("enum", "const", "required") else copy.deepcopy(v)
        if out.get("type") == "object" and "properties" in out:
            out.setdefault("additionalProperties", False)
        return out

    return walk(schema)


def check_schemas(schemas, n: int) -> list:
    """``schemas`` of ``generate`` as ``n`` entries (None -> all None); ValueError / TypeError."""
    if schemas is None:
        return [None] * n
    schemas = list(schemas)
    if len(schemas) != n:
        raise ValueError(f"schemas has {len(schemas)} entries for a batch of {n} conversations")
    for i, s in enumerate(schemas):
        if s is not None and not isinstance(s, JsonSchema):
            raise TypeError(f"schemas[{i}] must be a memgym.llm.structured.JsonSchema or None, got {type(s).__name__}")
    return schemas


def _bound(node, max_chars, max_items):
    if isinstance(node, list):
        return [_bound(x, max_chars, max_items) for x in node]
    if not isinstance(node, dict):
        return node
    out = {k: (v if k in ("enum", "const", "required") else _bound(v, max_chars, max_items)) for k, v in node.items()}
    if max_chars is not None and out.get("type") == "string" and "enum" not in out and "const" not in out:
        out["maxLength"] = min(int(out.get("maxLength", max_chars)), max_chars)
    if max_items is not None and out.get("type") == "array":
        out["maxItems"] = min(int(out.get("maxItems", max_items)), max_items)
        if int(out.get("minItems", 0)) > out["maxItems"]:
            raise ValueError(f"max_items {max_items} is below an array's minItems {out['minItems']}")
    return out


_BOUNDED: dict = {}


def bounded(schema: JsonSchema, max_chars: int | None = None, max_items: int | None = None) -> JsonSchema:
    """``schema`` with free strings capped at ``max_chars`` and arrays at ``max_items`` (None:
    unbounded), so constrained decoding always ends. Cached; ValueError for bounds < 1 or < minItems."""

    if max_chars is None and max_items is None:
        return schema
    if (max_chars is not None and max_chars < 1) or (max_items is not None and max_items < 1):
        raise ValueError(f"schema bounds must be >= 1, got max_chars={max_chars}, max_items={max_items}")
    key = (schema.name, schema.digest, max_chars, max_items)
    if key not in _BOUNDED:
        _BOUNDED[key] = JsonSchema(schema.name, _bound(schema.as_dict(), max_chars, max_items))
    return _BOUNDED[key]
