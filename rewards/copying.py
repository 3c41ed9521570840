"""Verbatim-copy rate of a manager output against the session transcript it was given.

memgym's own correction, not MemBuilder's: with answer-recall as the judge, a core output that
pastes transcript lines into the core block contains the answers and scores as well as a
distilled profile, so GRPO learns to copy (measured on the CPU recipe, issue 17: ADRPO core
outputs such as ``APPEND "Maria: Hey John! Long time no see! ... John: Hey Maria! ..."``, which
on longer held-out sessions run into the token limit and fail the format gate). The core
block is a persistent profile (MemBuilder §3.1), so copied dialogue is what it must not hold.

Definition (word level, case-insensitive; words are ``\\w+`` runs). Word i of the written
text y is *copied* when it lies inside an n-gram of y that also occurs in a source x (the
transcript; for APPEND / REPLACE also the current core block, which they would duplicate) or
that already occurred earlier in y itself (a repetition loop such as "Nate: Nate: Nate: ...",
where the first occurrence stays uncopied):

    CP(y) = |{copied words of y}| / |words(y)|,  n-gram length n (default 6)

CP in [0, 1]; 0 for an empty text and for texts shorter than ``n`` words (a short fact such as
"Nate likes video games" may legitimately repeat the speaker's words). Reward use
(:class:`rewards.session_reward.SessionReward`): ``R = g · acc · (1 - λ·LP) · (1 - μ·CP)``
with μ = ``SessionRewardConfig.copy_penalty`` (0 = off, MemBuilder's reward exactly).
Measured (200-token segments, SmolLM2 tokenizer, n = 6, transcript only): the expert's core
writes of conv-26 CP 0.044 on average (20 writes, max 0.26); SmolLM2 after SFT on held-out
conv-41/42 0.54, after ADRPO 0.44-0.72 (:func:`training.heldout.core_copy_stats`), e.g.
``"Nate: I love action and sci-fi movies, the effects are so cool! What about you, what's your
favorite genre?"`` pasted from the dialogue.
The n-gram overlap is the unit of the copy-rate measures of extractive-summary evaluation
(the "novel n-gram" share of See et al. 2017, "Get To The Point", and the extractive
"coverage" of Grusky et al. 2018, Newsroom).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

__all__ = ["copy_rate", "prompt_transcript", "words"]

_WORD = re.compile(r"\w+")
#: The line build_prompt puts before the transcript and the one it puts after it
#: (memory_bank.prompts.build_prompt).
_BEFORE = "New session transcript:\n"
_AFTER = "\n\nNow output the JSON for the "


def words(text: str) -> list[str]:
    """Lower-cased ``\\w+`` words of ``text``. Raises TypeError for a non-str."""
    if not isinstance(text, str):
        raise TypeError(f"words: expected a str, got {type(text).__name__}")
    return _WORD.findall(text.lower())


def copy_rate(written: str, source: str | Sequence[str], n: int = 6, *, self_repeats: bool = True) -> float:
    """Share in [0, 1] of ``written``'s words covered by an n-gram that occurs verbatim (as
    words, case-insensitive) in ``source`` (one text or several) or, with ``self_repeats``,
    earlier in ``written`` itself (module docstring). 0.0 when ``written`` has fewer than
    ``n`` words. Raises ValueError for ``n`` < 2, TypeError for non-str texts.

    Example: written "Nate: playing video games and watching movies" against a transcript
    holding "Nate: playing video games and watching movies are ..." gives 1.0; "Nate enjoys
    gaming and films" gives 0.0.
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
    :func:`memory_bank.prompts.build_prompt` (the text between its "New session transcript:"
    line and its closing instruction). Raises ValueError when no user message holds it."""
    for msg in reversed(messages):
        content = msg.get("content") if isinstance(msg, dict) else None
        if msg.get("role") == "user" and isinstance(content, str) and _BEFORE in content:
            body = content.rsplit(_BEFORE, 1)[1]
            return body.rsplit(_AFTER, 1)[0] if _AFTER in body else body
    raise ValueError("prompt_transcript: no user message with a 'New session transcript:' section "
                     "(not a memory_bank.prompts.build_prompt prompt)")
