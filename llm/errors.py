"""The errors memgym raises for a bad recipe or command-line value (below every package, so
any layer, the model helpers in :mod:`llm.models` included, can raise them without importing
the recipe checks)."""
from __future__ import annotations


class ConfigError(ValueError):
    """A recipe or command-line value is invalid. The message names the field (as the
    ``--flag`` the user sets), the value given and what is allowed."""


class OutputPathError(ConfigError):
    """An output path that memgym refuses to write: an existing file where a directory is
    expected, or a non-empty directory that memgym did not create."""
