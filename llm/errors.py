"""The root of memgym's error hierarchy, :class:`MemgymError`, the recipe errors, and which
exceptions are the user's input or environment (one stderr line, exit status 2 or 1) rather than a
bug in memgym (a traceback): :func:`exit_status`, :func:`one_line`, :func:`report_errors`."""
from __future__ import annotations

import sys


class MemgymError(Exception):
    """Base of every error that is the user's input or environment, not a bug in memgym: a bad
    recipe value, a missing or broken file, a dead server, a corrupt cache. ``memgym`` prints
    one as one stderr line and exits with :attr:`exit_status`. Subclasses keep a stdlib base.

    ``kind`` says what went wrong: ``"usage"`` (a bad recipe value, flag or argument; exit
    status 2) or the part that failed (exit status 1): ``"backend"`` (a model server or spec),
    ``"cache"``, ``"model"`` (a model package), ``"truncated"`` (a cut-off model output),
    ``"model_output"`` (a manager output that does not parse or apply), ``"data"`` (a data,
    trajectory, QA or bank file), ``"locked"`` (a file another process holds); ``"offline"`` (a data
    host that cannot be reached, so the user fetches by hand) exits 2 like ``"usage"``."""

    kind = "run"

    @property
    def exit_status(self) -> int:
        """2 for a usage error or an unreachable data host, 1 for anything else."""
        return 2 if self.kind in ("usage", "offline") else 1


class ConfigError(MemgymError, ValueError):
    """A recipe or command-line value is invalid (message: the ``--flag``, the value, what is allowed)."""

    kind = "usage"


class OutputPathError(ConfigError):
    """An output path memgym refuses: a file where a directory is expected, or a foreign non-empty directory."""

def exit_status(exc: BaseException) -> int | None:
    """The exit status of an error that is the user's input or environment: a
    :class:`~memgym.llm.errors.MemgymError` (its ``exit_status``: 2 for ``kind == "usage"``, else 1),
    broken YAML (2) or an ``OSError`` (a missing or unreadable file, 1).
    None for anything else: a bug, which keeps its traceback."""
    import yaml

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


def report_errors(prog: str, fn, *args) -> int:
    """Run ``fn(*args)`` and return its exit status (``int(result or 0)``). A user error
    (:func:`exit_status` not None) becomes one stderr line ``<prog>: <message>`` and its exit
    status; Ctrl-C is ``<prog>: interrupted`` and 130; a bug, or any error under
    :func:`debug_requested`, is re-raised with its traceback. ``prog`` may be a callable
    returning the name (asked only when a message is printed). Used by ``memgym`` and by the
    trainers' standalone entries (``python -m memgym.training.sft|adrpo``, what ``memgym launch`` runs)."""
    name = prog if isinstance(prog, str) else None
    try:
        return int(fn(*args) or 0)
    except KeyboardInterrupt:
        print(f"{name or prog()}: interrupted", file=sys.stderr)
        return 130
    except Exception as e:  # noqa: BLE001 - classified below; bugs are re-raised
        status = exit_status(e)
        if debug_requested() or status is None:
            raise
        print(f"{name or prog()}: {one_line(e)}", file=sys.stderr)
        return status
