"""Which exceptions are the user's input or environment (one stderr line, exit status 2 or 1)
rather than a bug in memgym (a traceback), and how such an error reads on one line. Used by
:func:`launch.cli.run_command` and by the commands that handle their own errors."""
from __future__ import annotations

import sys


def exit_status(exc: BaseException) -> int | None:
    """The exit status of an error that is the user's input or environment: a
    :class:`~llm.errors.MemgymError` (its ``exit_status``: 2 for ``kind == "usage"``, else 1),
    broken YAML (2) or an ``OSError`` (a missing or unreadable file, 1).
    None for anything else: a bug, which keeps its traceback."""
    import yaml

    from llm.errors import MemgymError

    if isinstance(exc, MemgymError):
        return exc.exit_status
    if isinstance(exc, yaml.YAMLError):
        return 2
    if isinstance(exc, OSError):
        return 1
    import sqlite3

    if isinstance(exc, sqlite3.Error):  # a damaged cache or run database
        return 1
    return None


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


def debug_requested() -> bool:
    """True under ``memgym --debug`` (which sets ``MEMGYM_DEBUG=1`` for the command) or
    ``MEMGYM_DEBUG`` set to anything but ``""``/``"0"``."""
    import os

    return os.environ.get("MEMGYM_DEBUG", "") not in ("", "0")


def say_error(prog: str, message: object) -> None:
    """Print ``<prog>: <message>`` on stderr: the one line of a user error that a command
    handles itself. Under :func:`debug_requested`, called inside an ``except`` block, the
    traceback of the exception being handled is printed first (as ``--debug`` promises)."""
    if debug_requested() and sys.exc_info()[0] is not None:
        import traceback

        traceback.print_exc()
    print(f"{prog}: {message}", file=sys.stderr)
