"""JSON schemas of the four managers' outputs (``docs/design.md`` § "Structured outputs"): pydantic's
schema of :data:`memgym.memory_bank.actions.CoreOp` / :class:`memgym.memory_bank.actions.PartOutput`, closed
(:func:`memgym.llm.structured.closed_schema`) and narrowed to what the prompt shows: a part's
``UPDATE``/``DELETE``/``MERGE`` ids become an ``enum`` of the shown ids (none shown: only ``ADD``;
``MERGE`` needs two), and core ``REPLACE``'s ``old_text`` an ``enum`` of the shown core lines
(:func:`memgym.memory_bank.prompts.core_block_lines`; empty block: no ``REPLACE``). A ``MERGE`` repeating
an id, or an operation on an id deleted earlier in the output, stays a validation matter.
"""
from __future__ import annotations

import copy
import functools

from pydantic import TypeAdapter

from memgym.llm.structured import JsonSchema, closed_schema
from memgym.memory_bank.actions import ID_PREFIX, MANAGERS, CoreOp, PartOutput
from memgym.memory_bank.prompts import ManagerPrompt

_ID_OPS = ("Update", "Delete", "Merge")


@functools.lru_cache(maxsize=None)
def _base(manager: str) -> dict:
    model = CoreOp if manager == "core" else PartOutput
    return closed_schema(TypeAdapter(model).json_schema())


def _narrow_ids(schema: dict, ids: tuple[str, ...]) -> dict:
    defs = schema["$defs"]
    items = schema["properties"]["operations"]["items"]
    keep = {"Add"}
    if ids:
        keep |= {"Update", "Delete"}
        defs["Update"]["properties"]["id"] = {"enum": list(ids), "title": "Id", "type": "string"}
        defs["Delete"]["properties"]["id"] = {"enum": list(ids), "title": "Id", "type": "string"}
    if len(ids) >= 2:
        keep.add("Merge")
        merge_ids = defs["Merge"]["properties"]["ids"]
        merge_ids["items"] = {"enum": list(ids), "type": "string"}
        merge_ids["maxItems"] = len(ids)
    items["anyOf"] = [b for b in items["anyOf"] if b["$ref"].rsplit("/", 1)[1] in keep]
    for name in _ID_OPS:
        if name not in keep:
            del defs[name]
    return schema


def _narrow_core(schema: dict, lines: tuple[str, ...]) -> dict:
    if lines:
        schema["$defs"]["CoreReplace"]["properties"]["old_text"] = {"enum": list(lines), "title": "Old Text",
                                                                     "type": "string"}
    else:
        schema["anyOf"] = [b for b in schema["anyOf"] if not b["$ref"].endswith("/CoreReplace")]
        del schema["$defs"]["CoreReplace"]
    return schema


@functools.lru_cache(maxsize=4096)
def manager_schema(manager: str, ids: tuple[str, ...] | None = None,
                   core_lines: tuple[str, ...] | None = None) -> JsonSchema:
    """The :class:`memgym.llm.structured.JsonSchema` of ``manager``'s output (cached per shape).
        ``ids``: a part's shown entry ids (``()``: only ADD; None: any string; None for core);
        ``core_lines``: core's shown lines (``()``: no REPLACE; None: free). ValueError for an unknown
        manager, a misplaced argument or an id without the part's prefix.
        """
    if manager not in MANAGERS:
        raise ValueError(f"unknown manager {manager!r}; expected one of {MANAGERS}")
    schema = copy.deepcopy(_base(manager))
    if manager == "core":
        if ids:
            raise ValueError("the core manager has no entry ids")
        if core_lines is not None:
            bad = [x for x in core_lines if not isinstance(x, str) or not x]
            if bad:
                raise ValueError(f"core_lines must be non-empty strings, got {bad[:3]}")
            schema = _narrow_core(schema, tuple(core_lines))
        return JsonSchema("memgym_core", schema)
    if core_lines is not None:
        raise ValueError(f"core_lines are for the core manager, not {manager}")
    if ids is not None:
        prefix = ID_PREFIX[manager]
        bad = [i for i in ids if not (isinstance(i, str) and i.startswith(prefix) and i[1:].isdigit())]
        if bad:
            raise ValueError(f"{manager} ids must look like {prefix}<n>, got {bad}")
        schema = _narrow_ids(schema, tuple(ids))
    return JsonSchema(f"memgym_{manager}", schema)


def prompt_schema(prompt: ManagerPrompt) -> JsonSchema:
    """The schema for one manager prompt: its part's operations with ids narrowed to
    ``prompt.shown_ids`` (core: REPLACE's ``old_text`` narrowed to ``prompt.core_lines``)."""
    if prompt.manager == "core":
        lines = prompt.core_lines
        return manager_schema("core", None, None if lines is None else tuple(lines))
    return manager_schema(prompt.manager, tuple(prompt.shown_ids))
