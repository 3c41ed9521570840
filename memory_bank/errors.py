"""Typed errors for manager outputs, each with ``error_type``: the stable short name ``memgym bank
check`` prints and the reward's format gate logs."""
from __future__ import annotations

from memgym.llm.base import TruncatedOutputError
from memgym.llm.errors import MemgymError


class ManagerOutputError(MemgymError, ValueError):
    """Base class: a manager output that cannot be applied. The bank is left untouched."""

    kind = "model_output"

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
    """The output was cut off (token limit or unterminated JSON): a format failure."""

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


class BankFormatError(MemgymError, ValueError):
    """A serialized bank (JSON) is malformed; the message names the field."""

    kind = "data"


# ---- memory programs (memgym.memory_bank.contract) ----


class ProgramError(Exception):
    """Base class of memory-program contract errors."""


class ContractError(ProgramError):
    """A program breaks the contract. ``level`` is the PrisMem validation level that catches
    it: 1 = a required name is missing, 2 = a schema or signature is incompatible."""

    def __init__(self, message: str, level: int = 2):
        super().__init__(message)
        self.level = level


class StructuredOutputError(ProgramError, ValueError):
    """A structured output (or host data) does not fit a program's dataclass ``schema``; ``field``
        and ``index`` locate it (None: the whole output).
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
