"""The memory action space: pydantic models for the four managers' JSON outputs, tolerant
parsing, and validation with typed errors.

Source: ``docs/design.md`` § "The memory bank and its action space"::

    core:  {"operation": "APPEND", "content": s} | {"operation": "REPLACE", "old_text": s, "new_text": s}
           | {"operation": "REWRITE", "content": s} | {"operation": "NONE"}
    other: {"operations": [ {"action": "ADD", "memory": s} | {"action": "UPDATE", "id": "E3", "memory": s}
           | {"action": "MERGE", "ids": ["E3","E7"], "memory": s} | {"action": "DELETE", "id": "E3"} ]}
"""
from __future__ import annotations

import json
from typing import Annotated, Literal, Union

import json_repair
from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError

from memgym.memory_bank.errors import OutputParseError, OutputSchemaError, OutputTruncatedError, WrongPartError

PARTS = ("episodic", "semantic", "procedural")
MANAGERS = ("core",) + PARTS
ID_PREFIX = {"episodic": "E", "semantic": "S", "procedural": "P"}

#: Outputs longer than this many characters are rejected before parsing (a runaway
#: generation or a hostile input); 200K chars is ~50K tokens, far above any real output.
MAX_OUTPUT_CHARS = 200_000


class _Op(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=False)


class CoreAppend(_Op):
    operation: Literal["APPEND"]
    content: str = Field(min_length=1)


class CoreReplace(_Op):
    operation: Literal["REPLACE"]
    old_text: str = Field(min_length=1)
    new_text: str


class CoreRewrite(_Op):
    operation: Literal["REWRITE"]
    content: str


class CoreNone(_Op):
    operation: Literal["NONE"]


CoreOp = Annotated[Union[CoreAppend, CoreReplace, CoreRewrite, CoreNone], Field(discriminator="operation")]


class Add(_Op):
    action: Literal["ADD"]
    memory: str = Field(min_length=1)


class Update(_Op):
    action: Literal["UPDATE"]
    id: str
    memory: str = Field(min_length=1)


class Merge(_Op):
    action: Literal["MERGE"]
    ids: list[str] = Field(min_length=2)
    memory: str = Field(min_length=1)


class Delete(_Op):
    action: Literal["DELETE"]
    id: str


PartOp = Annotated[Union[Add, Update, Merge, Delete], Field(discriminator="action")]


class PartOutput(_Op):
    operations: list[PartOp]


_CORE_ADAPTER = TypeAdapter(CoreOp)
_PART_ADAPTER = TypeAdapter(PartOutput)


_CLOSER = {"{": "}", "[": "]"}


def _value_start(text: str) -> int:
    """Index of the first ``{`` or of a ``[`` that opens a list of objects (``[{``), else -1."""
    for i, ch in enumerate(text):
        if ch == "{":
            return i
        if ch == "[" and text[i + 1:].lstrip().startswith("{"):
            return i
    return -1


def unterminated_json(text: str) -> str | None:
    """Where ``text`` ends inside its JSON value (``"string"``, ``"object"``, ``"array"``), or None
        when it closes or there is none. The value starts at the first ``{`` (or ``[`` of objects);
        escapes are tracked and a mismatched closer closes the nearest matching opener. Tells a cut-off
        output from one that only needs repair."""
    start = _value_start(text)
    if start < 0:
        return None
    stack: list[str] = []
    in_string = escaped = False
    for ch in text[start:]:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in _CLOSER:
            stack.append(ch)
        elif ch in ("}", "]"):
            opener = "{" if ch == "}" else "["
            if opener in stack:
                while stack.pop() != opener:
                    pass
            if not stack:
                return None
    if in_string:
        return "string"
    if stack:
        return "object" if stack[-1] == "{" else "array"
    return None


def _check_finished(manager: str, finish_reason: str | None) -> None:
    if finish_reason == "length":
        raise OutputTruncatedError("the completion stopped on the token limit (finish_reason 'length')",
                                   manager=manager)


def _recover_object(text: str, manager: str) -> dict:
    """One JSON object recovered from model text by ``json_repair``; :class:`OutputTruncatedError`
        when the text ends inside an unterminated value."""
    if not isinstance(text, str):
        raise OutputParseError(f"expected text, got {type(text).__name__}", manager=manager)
    if len(text) > MAX_OUTPUT_CHARS:
        raise OutputParseError(f"output is {len(text)} characters, over the {MAX_OUTPUT_CHARS} limit", manager=manager)
    if "\x00" in text:
        raise OutputParseError("output contains NUL bytes (binary input)", manager=manager)
    stripped = text.strip()
    if not stripped:
        raise OutputParseError("output is empty", manager=manager)
    try:
        obj = json.loads(stripped)
    except ValueError:
        cut = unterminated_json(stripped)
        if cut is not None:
            raise OutputTruncatedError(f"output ends inside an unterminated {cut} (...{stripped[-40:]!r})",
                                       manager=manager) from None
        try:
            obj = json_repair.loads(stripped)
        except Exception as e:  # json_repair raises assorted errors on pathological input
            raise OutputParseError(f"JSON repair failed: {type(e).__name__}", manager=manager) from None
    if isinstance(obj, list) and len(obj) == 1 and isinstance(obj[0], dict):
        obj = obj[0]
    if not isinstance(obj, dict) or not obj:
        raise OutputParseError(
            f"expected one JSON object, recovered {type(obj).__name__} from {stripped[:80]!r}", manager=manager
        )
    return obj


def _schema_error(e: ValidationError, manager: str) -> OutputSchemaError:
    err = e.errors()[0]
    loc = ".".join(str(x) for x in err.get("loc", ()))
    op_index = None
    locs = err.get("loc", ())
    if len(locs) >= 2 and locs[0] == "operations" and isinstance(locs[1], int):
        op_index = locs[1]
    return OutputSchemaError(f"field '{loc or '<root>'}': {err.get('msg')}", manager=manager, op_index=op_index)


def parse_core(text: str, finish_reason: str | None = None) -> CoreAppend | CoreReplace | CoreRewrite | CoreNone:
    """The core manager's output as one core operation (``finish_reason`` ``"length"``: cut off).
        Raises OutputTruncatedError, OutputParseError, WrongPartError, OutputSchemaError."""
    _check_finished("core", finish_reason)
    obj = _recover_object(text, "core")
    if "operation" not in obj and "operations" in obj:
        raise WrongPartError("core takes one {'operation': ...}, not an 'operations' list", manager="core")
    if isinstance(obj.get("operation"), str):
        obj = {**obj, "operation": obj["operation"].strip().upper()}
    try:
        return _CORE_ADAPTER.validate_python(obj)
    except ValidationError as e:
        raise _schema_error(e, "core") from None


def parse_part(text: str, part: str, finish_reason: str | None = None) -> list[Add | Update | Merge | Delete]:
    """A part manager's operations (ids with the part's prefix; ``[]``: no change). Raises
        OutputTruncatedError, OutputParseError, OutputSchemaError, WrongPartError."""
    if part not in PARTS:
        raise ValueError(f"unknown part {part!r}; expected one of {PARTS}")
    _check_finished(part, finish_reason)
    obj = _recover_object(text, part)
    if "operations" not in obj and "operation" in obj:
        raise WrongPartError(f"{part} takes {{'operations': [...]}}, not a core 'operation'", manager=part)
    ops = obj.get("operations")
    if isinstance(ops, list):
        ops = [
            {**o, "action": o["action"].strip().upper()} if isinstance(o, dict) and isinstance(o.get("action"), str) else o
            for o in ops
        ]
        obj = {**obj, "operations": ops}
    try:
        parsed = _PART_ADAPTER.validate_python(obj).operations
    except ValidationError as e:
        raise _schema_error(e, part) from None
    prefix = ID_PREFIX[part]
    for i, op in enumerate(parsed):
        ids = op.ids if isinstance(op, Merge) else [op.id] if isinstance(op, (Update, Delete)) else []
        for id_ in ids:
            if not id_.startswith(prefix) or not id_[1:].isdigit():
                raise WrongPartError(f"id {id_!r} is not {'an' if part[0] in 'aeiou' else 'a'} {part} id ({prefix}<n>)", manager=part, op_index=i)
    return parsed


def parse_output(manager: str, text: str, finish_reason: str | None = None):
    """Dispatch to :func:`parse_core` or :func:`parse_part`. ``finish_reason`` (the
    completion's, when known): ``"length"`` fails with :class:`OutputTruncatedError`."""
    if manager == "core":
        return parse_core(text, finish_reason)
    return parse_part(text, manager, finish_reason)


def ops_to_json(manager: str, ops) -> dict:
    """The canonical JSON object of parsed operations (inverse of :func:`parse_output`)."""
    if manager == "core":
        return ops.model_dump()
    return {"operations": [o.model_dump() for o in ops]}
