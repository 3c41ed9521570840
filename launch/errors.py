"""Which exceptions are the user's input or environment (one stderr line, exit status 2 or 1)
rather than a bug in memgym (a traceback), and how such an error reads on one line. Used by
:func:`launch.cli.run_command` and by the commands that handle their own errors."""
from __future__ import annotations

import sys


def user_error_types() -> tuple[tuple[type, ...], tuple[type, ...]]:
    """``(usage_errors, run_errors)``: exception types that are the user's input or
    environment, not a bug in memgym. Usage errors exit 2, run errors exit 1."""
    import yaml

    from llm.base import LLMError, TruncatedOutputError
    from llm.errors import ConfigError
    from llm.messages import BatchError
    from llm.models import ModelPackageMissing

    usage: list[type] = [ConfigError, yaml.YAMLError]
    run: list[type] = [OSError, LLMError, ModelPackageMissing, TruncatedOutputError, BatchError]
    for module, names, into in (
        ("llm.cache", ("CacheCorruptError",), run),
        ("memory_bank.errors", ("ManagerOutputError", "BankFormatError"), run),
        ("data_synth.errors", ("DataFormatError",), run),
        ("data_synth.expert", ("TrajectoryError",), run),
        ("data_synth.jsonl", ("JsonlCorruptError", "JsonlLockedError"), run),
        ("data_synth.qa_format", ("SessionQAError",), run),
        ("data_synth.annotate", ("LabelValidationError",), run),
        ("rewards.session_reward", ("RewardDataError",), run),
        ("training.adrpo_config", ("ADRPOConfigError",), usage),
        ("training.adrpo_data", ("ADRPODataError",), run),
        ("training.sft_data", ("TrainingDataError", "ExampleLengthError"), run),
        ("launch.cmd_launch", ("LaunchError",), usage),
        ("launch.cmd_synth", ("UsageError",), usage),
    ):
        mod = sys.modules.get(module)  # a module never imported cannot have raised its errors
        if mod is None:
            continue
        into.extend(getattr(mod, n) for n in names if hasattr(mod, n))
    return tuple(usage), tuple(run)


def one_line(exc: BaseException, limit: int = 600) -> str:
    """``exc`` as one line: its message with whitespace runs collapsed, cut at ``limit``
    characters; the type name is added when the message does not already say it."""
    msg = " ".join(str(exc).split()) or type(exc).__name__
    if isinstance(exc, OSError) and getattr(exc, "filename", None) and str(exc.filename) not in msg:
        msg = f"{msg}: {exc.filename}"
    if isinstance(exc, (KeyError,)) or msg == type(exc).__name__:
        msg = f"{type(exc).__name__}: {msg}"
    elif type(exc).__module__ == "yaml" or type(exc).__module__.startswith("yaml."):
        msg = f"broken YAML: {msg}"
    return msg if len(msg) <= limit else msg[: limit - 1] + "…"
