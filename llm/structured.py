"""Structured outputs: JSON schemas that constrain a completion, shared by every backend.

Source: ``DESIGN.md`` § "Structured outputs". A caller passes ``schemas=[JsonSchema | None, ...]``
(one per conversation) to ``Backend.generate``; the ``hf`` backend decodes under the schema's
grammar (llguidance), ``vllm`` uses its structured-output sampling parameters and ``openai``
sends ``response_format={"type": "json_schema", ...}``. ``None`` leaves that conversation free.

Constrained decoding is an inference option: it changes the sampling distribution, so it is not
used for RL rollouts (the policy's own distribution must be kept).
"""
from __future__ import annotations

import copy
import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from llm.base import BackendRequestError

_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


class ConstraintRefusedError(BackendRequestError):
    """A server refused (or ignored) a JSON-schema ``response_format``. The message names the
    server and how to turn constraint off; memgym never falls back to free generation silently."""


@dataclass(frozen=True, eq=False)
class JsonSchema:
    """A named JSON schema for one structured call.

    ``name``: 1-64 characters of ``[A-Za-z0-9_-]`` (OpenAI's ``json_schema.name`` rule).
    ``schema``: a JSON-serialisable JSON-schema dict (draft 2020-12 subset: objects, arrays,
    strings, enums, ``anyOf``, ``$defs``/``$ref``, ``minLength``/``maxLength``,
    ``minItems``/``maxItems``). ``canonical`` is its compact JSON, keys in the dict's order
    (the order of ``properties`` is the order a grammar writes them, so it is part of the
    schema), and ``digest`` the sha256 of that (16 hex digits): two schemas are equal iff
    their digests are, and the response cache keys on the digest. Raises ValueError for a bad name or a non-dict schema.
    """

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
    """A copy of a pydantic-generated JSON schema made fit for constrained decoding.

    - every object gets ``additionalProperties: false`` (the grammar then emits only the declared
      keys, and OpenAI's strict mode requires it);
    - ``oneOf`` becomes ``anyOf`` (same language when the branches are disjoint, as tagged unions
      are; ``oneOf`` is outside OpenAI's strict subset);
    - pydantic's ``discriminator`` annotation (not a validation keyword) is dropped.
    """
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
    """Validate a ``schemas`` argument of ``Backend.generate`` for a batch of ``n``.

    Returns a list of ``n`` entries (``JsonSchema`` or None); ``None`` → all None.
    Raises ValueError (wrong length) or TypeError (an entry of another type)."""
    if schemas is None:
        return [None] * n
    schemas = list(schemas)
    if len(schemas) != n:
        raise ValueError(f"schemas has {len(schemas)} entries for a batch of {n} conversations")
    for i, s in enumerate(schemas):
        if s is not None and not isinstance(s, JsonSchema):
            raise TypeError(f"schemas[{i}] must be a llm.structured.JsonSchema or None, got {type(s).__name__}")
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
    """``schema`` with every free string capped at ``max_chars`` characters (``maxLength``) and
    every array at ``max_items`` items (``maxItems``); None leaves that unbounded.

    A bounded schema has a longest document, so constrained decoding ends (EOS) within a
    known number of tokens whatever the model does: a small or untrained model can otherwise
    stay inside one string until the token limit cuts it (``finish_reason == "length"``).
    Cached per (schema, bounds). Raises ValueError for bounds < 1 or below a ``minItems``."""
    if max_chars is None and max_items is None:
        return schema
    if (max_chars is not None and max_chars < 1) or (max_items is not None and max_items < 1):
        raise ValueError(f"schema bounds must be >= 1, got max_chars={max_chars}, max_items={max_items}")
    key = (schema.name, schema.digest, max_chars, max_items)
    if key not in _BOUNDED:
        _BOUNDED[key] = JsonSchema(schema.name, _bound(schema.as_dict(), max_chars, max_items))
    return _BOUNDED[key]
