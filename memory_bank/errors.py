"""Typed errors for manager outputs. Each carries ``error_type``: a stable short name that
``memgym bank check`` prints and the reward's format gate logs.

Source: ``DESIGN.md`` § "The memory bank and its action space" (the error list: unknown id,
REPLACE text not found, missing field, wrong action for the part).
"""
from __future__ import annotations

from llm.base import TruncatedOutputError


class ManagerOutputError(ValueError):
    """Base class: a manager output that cannot be applied. The bank is left untouched."""

    error_type = "invalid_output"

    def __init__(self, message: str, *, manager: str | None = None, op_index: int | None = None):
        where = []
        if manager:
            where.append(f"manager {manager}")
        if op_index is not None:
            where.append(f"operation {op_index}")
        super().__init__(f"{', '.join(where)}: {message}" if where else message)
        self.manager = manager
        self.op_index = op_index


class OutputParseError(ManagerOutputError):
    """No JSON object could be recovered from the text (empty, binary, prose only, a list)."""

    error_type = "parse_error"


class OutputTruncatedError(OutputParseError, TruncatedOutputError):
    """The output was cut off: the completion stopped on the token limit, or the text ends
    inside an unterminated JSON string, object or array. Applying what was recovered would
    write half-finished memory, so it is a format failure like any other."""

    error_type = "truncated"


class OutputSchemaError(ManagerOutputError):
    """The JSON object has a missing field, an unknown action or a wrong type."""

    error_type = "schema_error"


class WrongPartError(ManagerOutputError):
    """An action that does not belong to this manager's part (e.g. ``S3`` in episodic)."""

    error_type = "wrong_part"


class UnknownIdError(ManagerOutputError):
    """An UPDATE/MERGE/DELETE names an id that is not (or no longer) in the part."""

    error_type = "unknown_id"


class ReplaceTextNotFoundError(ManagerOutputError):
    """A core REPLACE whose ``old_text`` does not occur in the core block."""

    error_type = "replace_text_not_found"


class BankFormatError(ValueError):
    """A serialized bank (JSON) is malformed; the message names the field."""
