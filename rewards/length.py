"""Length penalty of the dense session reward, measured in tokens of the policy's tokenizer.

Source: ``DESIGN.md`` § "Dense session reward and ADRPO", step 4 (MemBuilder, arXiv
2601.05488, Eqs. 7-8 and Appendix B.4: θ_min = 150, θ_max = 400, δ = 200, γ_l = 0.5,
γ_u = 1.3). Every length here is a count of tokens of ONE tokenizer, the policy's: public
code once measured the completion in tokens and the expert's output in characters, so a
completion exactly as long as the expert's was penalised. A completion and its expert
reference are therefore always counted by the same :func:`count_tokens` call.

- Core: ``LP = clip((n - lo) / (hi - lo), 0, 1)`` with ``n`` the tokens of the text the core
  operation writes (see :func:`core_written_text`), lo = 150, hi = 400.
- Episodic / semantic / procedural, with ``r = n / n_expert``:
  ``LP = 0`` if ``|n - n_expert| < 200`` or ``0.5 <= r <= 1.3``; above the band LP rises
  linearly from 0 at r = 1.3 to 1 at r = 2.0; below it, from 0 at r = 0.5 to 1 at r = 0.2;
  clipped to [0, 1].
"""
from __future__ import annotations

from collections.abc import Sequence

from memory_bank.actions import CoreAppend, CoreNone, CoreReplace, CoreRewrite

__all__ = ["core_length_penalty", "part_length_penalty", "core_written_text", "count_tokens"]


def _clip01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else float(x)


def _check_count(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{what} must be a token count (int >= 0), got {n!r}")
    return n


def core_length_penalty(n_tokens: int, lo: int = 150, hi: int = 400) -> float:
    """LP of a core output in [0, 1]: ``clip((n_tokens - lo) / (hi - lo), 0, 1)``.

    ``n_tokens``: tokens of the written core text (policy tokenizer). Values: 0.0 up to
    ``lo`` tokens, 1.0 from ``hi`` tokens on, linear between (e.g. 275 → 0.5 with the
    defaults). Source: MemBuilder Eq. 7. Raises ValueError for a negative or non-int count
    or ``lo >= hi``.
    """
    _check_count(n_tokens, "n_tokens")
    if not lo < hi:
        raise ValueError(f"core length thresholds need lo < hi, got lo={lo}, hi={hi}")
    return _clip01((n_tokens - lo) / (hi - lo))


def part_length_penalty(n_tokens: int, expert_tokens: int, *, band_abs: int = 200, band_lo: float = 0.5,
                        band_hi: float = 1.3, r_min: float = 0.2, r_max: float = 2.0) -> float:
    """LP in [0, 1] of an episodic/semantic/procedural output against the expert's output.

    ``n_tokens`` / ``expert_tokens``: tokens of the completion and of the expert's output for
    the same manager and session, counted with the same (policy) tokenizer.
    ``r = n_tokens / expert_tokens``:

    - 0 when ``|n_tokens - expert_tokens| < band_abs`` (strict) or ``band_lo <= r <= band_hi``;
    - ``(r - band_hi) / (r_max - band_hi)`` above the band (1 at ``r = r_max``);
    - ``(band_lo - r) / (band_lo - r_min)`` below the band (1 at ``r = r_min``);
    - clipped to [0, 1].

    An empty expert output (``expert_tokens == 0``) makes ``r`` infinite: LP is then 0 while
    the completion is shorter than ``band_abs`` tokens and 1 beyond. Source: MemBuilder
    Eq. 8 / DESIGN.md step 4. Raises ValueError for bad counts or thresholds that are not
    ``0 <= r_min < band_lo <= band_hi < r_max``.
    """
    _check_count(n_tokens, "n_tokens")
    _check_count(expert_tokens, "expert_tokens")
    if not (0 <= r_min < band_lo <= band_hi < r_max) or band_abs < 0:
        raise ValueError(f"length band needs 0 <= r_min < band_lo <= band_hi < r_max and band_abs >= 0; got "
                         f"r_min={r_min}, band_lo={band_lo}, band_hi={band_hi}, r_max={r_max}, band_abs={band_abs}")
    if abs(n_tokens - expert_tokens) < band_abs:
        return 0.0
    if expert_tokens == 0:
        return 1.0
    r = n_tokens / expert_tokens
    if band_lo <= r <= band_hi:
        return 0.0
    if r > band_hi:
        return _clip01((r - band_hi) / (r_max - band_hi))
    return _clip01((band_lo - r) / (band_lo - r_min))


def core_written_text(op) -> str:
    """The text a parsed core operation writes, whose length the core LP measures.

    Choice (documented): APPEND and REWRITE → ``content``; REPLACE → ``new_text`` (the
    ``old_text`` only locates the edit, it writes nothing); NONE → "" (0 tokens, LP 0).
    The penalty thus prices what the operation adds to the core block, not the JSON around
    it. Raises TypeError for anything that is not a parsed core operation.
    """
    if isinstance(op, (CoreAppend, CoreRewrite)):
        return op.content
    if isinstance(op, CoreReplace):
        return op.new_text
    if isinstance(op, CoreNone):
        return ""
    raise TypeError(f"expected a parsed core operation, got {type(op).__name__}")


def count_tokens(tokenizer, texts: Sequence[str]) -> list[int]:
    """Token counts of ``texts`` under ``tokenizer`` (a Hugging Face tokenizer, called once on
    the whole list with ``add_special_tokens=False``). Empty strings count 0.

    Raises TypeError when a text is not a str or the tokenizer does not return
    ``input_ids`` (e.g. it is not a tokenizer at all).
    """
    texts = list(texts)
    for i, t in enumerate(texts):
        if not isinstance(t, str):
            raise TypeError(f"count_tokens: texts[{i}] must be a str, got {type(t).__name__}")
    if not texts:
        return []
    try:
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    except (TypeError, KeyError) as e:
        raise TypeError(f"count_tokens: {type(tokenizer).__name__} is not a usable tokenizer ({e})") from None
    if len(ids) != len(texts):
        raise TypeError(f"count_tokens: tokenizer returned {len(ids)} rows for {len(texts)} texts")
    return [len(row) for row in ids]
