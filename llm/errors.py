"""The root of memgym's error hierarchy, :class:`MemgymError`, and the recipe errors."""
from __future__ import annotations


class MemgymError(Exception):
    """Base of every error that is the user's input or environment, not a bug in memgym: a bad
    recipe value, a missing or broken file, a dead server, a corrupt cache. ``memgym`` prints
    one as one stderr line and exits with :attr:`exit_status`. Subclasses keep a stdlib base.

    ``kind`` says what went wrong: ``"usage"`` (a bad recipe value, flag or argument; exit
    status 2) or the part that failed (exit status 1): ``"backend"`` (a model server or spec),
    ``"cache"``, ``"model"`` (a model package), ``"truncated"`` (a cut-off model output),
    ``"model_output"`` (a manager output that does not parse or apply), ``"data"`` (a data,
    trajectory, QA or bank file), ``"locked"`` (a file another process holds)."""

    kind = "run"

    @property
    def exit_status(self) -> int:
        """2 for a usage error, 1 for anything else."""
        return 2 if self.kind == "usage" else 1


class ConfigError(MemgymError, ValueError):
    """A recipe or command-line value is invalid (message: the ``--flag``, the value, what is allowed)."""

    kind = "usage"


class OutputPathError(ConfigError):
    """An output path memgym refuses: a file where a directory is expected, or a foreign non-empty directory."""

