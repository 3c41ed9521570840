"""The memory-program interface: :mod:`.contract` (the names a program defines, module checks,
session metadata), :mod:`.records` (record field kinds, structured-output parsing) and
:mod:`.toolkit` (what a program may call), all re-exported here. Programs never import this
package; the sandbox child does, to build their toolkit.
"""
from memgym.memory_bank.errors import (BudgetExceededError, ContractError, ProgramError, StructuredOutputError,
                                ToolkitError)
from memgym.memory_bank.contract.contract import (INSTRUCTION_NAMES, METHOD_PARAMS, OUT_CHAR_BUDGET, REQUIRED_NAMES,
                                          ProgramInfo, SessionInfo, contract_from_report, describe_module)
from memgym.memory_bank.contract.records import (FIELD_KINDS, QUERY_FIELD_HINTS, TEXT_FIELD_NAMES, FieldSpec, coerce_record,
                                         dataclass_from_schema, describe_dataclass, parse_structured, schema_hint,
                                         session_entries, text_query, turn_entries, unit_text,
                                         units_from_entries)
from memgym.memory_bank.contract.toolkit import BackendToolkitHost, Toolkit, ToolkitHost

__all__ = [
    "BackendToolkitHost", "BudgetExceededError", "ContractError", "FIELD_KINDS", "FieldSpec", "INSTRUCTION_NAMES",
    "METHOD_PARAMS", "OUT_CHAR_BUDGET", "ProgramError", "ProgramInfo", "QUERY_FIELD_HINTS", "REQUIRED_NAMES",
    "SessionInfo", "StructuredOutputError", "TEXT_FIELD_NAMES", "Toolkit", "ToolkitError", "ToolkitHost",
    "coerce_record", "contract_from_report", "dataclass_from_schema", "describe_dataclass", "describe_module",
    "parse_structured", "schema_hint", "session_entries", "text_query", "turn_entries", "unit_text",
    "units_from_entries",
]
