"""Validation of chat batches before they reach any backend."""

from __future__ import annotations

from llm.errors import MemgymError

ROLES = ("system", "user", "assistant", "tool")


class BatchError(MemgymError, ValueError):
    """A chat batch is malformed; the message names ``batch[i][j]`` and the field."""

    kind = "backend"


def check_batch(batch) -> None:
    """Raise :class:`BatchError` unless ``batch`` is a list of non-empty lists of
    ``{"role": one of ROLES, "content": str}`` dicts (extra keys are allowed)."""
    if not isinstance(batch, (list, tuple)):
        raise BatchError(f"batch must be a list of conversations, got {type(batch).__name__}")
    for i, conv in enumerate(batch):
        if not isinstance(conv, (list, tuple)) or not conv:
            raise BatchError(f"batch[{i}] must be a non-empty list of messages, got {conv!r:.80}")
        for j, msg in enumerate(conv):
            if not isinstance(msg, dict):
                raise BatchError(f"batch[{i}][{j}] must be a dict with 'role' and 'content', got {type(msg).__name__}")
            role = msg.get("role")
            if role not in ROLES:
                raise BatchError(f"batch[{i}][{j}]['role'] must be one of {ROLES}, got {role!r}")
            if not isinstance(msg.get("content"), str):
                raise BatchError(
                    f"batch[{i}][{j}]['content'] must be a str, got {type(msg.get('content')).__name__}"
                )
