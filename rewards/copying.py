"""Verbatim-copy rate CP of a manager output against the session transcript it was given.

memgym's correction, not MemBuilder's: the core block is a persistent profile (MemBuilder
§3.1), so pasted dialogue is penalised. Word i of the written text y (``\\w+`` runs,
case-insensitive) is copied when it lies inside an n-gram of y that occurs in a source (the
transcript; for APPEND / REPLACE also the current core block) or earlier in y itself:

    CP(y) = |{copied words of y}| / |words(y)|  in [0, 1], n = 6 by default

0 for texts shorter than n words. Used as ``R = g·acc·(1 − λ·LP)·(1 − μ·CP)``
(:class:`memgym.rewards.session_reward.SessionReward`). Source: the novel n-gram share of See et
al. 2017 ("Get To The Point") and the coverage of Grusky et al. 2018 (Newsroom).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["copy_rate", "prompt_transcript", "words"]

_WORD = re.compile(r"\w+")
#: The line build_prompt puts before the transcript and the one it puts after it
#: (memgym.memory_bank.prompts.build_prompt).
_BEFORE = "New session transcript:\n"
_AFTER = "\n\nNow output the JSON for the "


def words(text: str) -> list[str]:
    """Lower-cased ``\\w+`` words of ``text``. Raises TypeError for a non-str."""
    if not isinstance(text, str):
        raise TypeError(f"words: expected a str, got {type(text).__name__}")
    return _WORD.findall(text.lower())


def copy_rate(written: str, source: str | Sequence[str], n: int = 6, *, self_repeats: bool = True) -> float:
    """Share in [0, 1] of ``written``'s words covered by an n-gram found verbatim in ``source``
    (one text or several) or, with ``self_repeats``, earlier in ``written``; 0.0 below ``n``
    words. Raises ValueError for ``n`` < 2, TypeError for non-str texts.
    """
    if isinstance(n, bool) or not isinstance(n, int) or n < 2:
        raise ValueError(f"copy_rate: n must be an int >= 2, got {n!r}")
    sources = [source] if isinstance(source, str) else list(source)
    w = words(written)
    if len(w) < n:
        return 0.0
    grams: set[tuple[str, ...]] = set()
    for src in sources:
        s = words(src)
        grams.update(tuple(s[i: i + n]) for i in range(len(s) - n + 1))
    seen: set[tuple[str, ...]] = set()
    covered = [False] * len(w)
    for i in range(len(w) - n + 1):
        g = tuple(w[i: i + n])
        if g in grams or (self_repeats and g in seen):
            covered[i: i + n] = [True] * n
        seen.add(g)
    return sum(covered) / len(w)


def prompt_transcript(messages: list[dict]) -> str:
    """The session transcript inside a manager prompt built by
    :func:`memgym.memory_bank.prompts.build_prompt` (the text between its "New session transcript:"
    line and its closing instruction). Raises ValueError when no user message holds it."""
    for msg in reversed(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if msg.get("role") == "user" and isinstance(content, str) and _BEFORE in content:
            body = content.rsplit(_BEFORE, 1)[1]
            return body.rsplit(_AFTER, 1)[0] if _AFTER in body else body
    raise ValueError("prompt_transcript: no user message with a 'New session transcript:' section "
                     "(not a memgym.memory_bank.prompts.build_prompt prompt)")
