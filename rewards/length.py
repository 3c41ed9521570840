"""Length penalty LP of the dense session reward, in tokens of the policy's tokenizer.

Source: MemBuilder (arXiv 2601.05488) Eqs. 7-8 and Appendix B.4 (θ_min = 150, θ_max = 400,
δ = 200, γ_l = 0.5, γ_u = 1.3). A completion and its expert reference are always counted by
the same :func:`count_tokens` call.
"""
from __future__ import annotations

from collections.abc import Sequence

from memgym.memory_bank.actions import CoreAppend, CoreNone, CoreReplace, CoreRewrite

__all__ = ["core_length_penalty", "part_length_penalty", "core_written_text", "count_tokens"]


def _clip01(x: float) -> float:
    return 0.0 if x < 0.0 else 1.0 if x > 1.0 else float(x)


def _check_count(n, what: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{what} must be a token count (int >= 0), got {n!r}")
    return n


def core_length_penalty(n_tokens: int, lo: int = 150, hi: int = 400) -> float:
    """Core LP in [0, 1] = ``clip((n_tokens - lo) / (hi - lo), 0, 1)`` (MemBuilder Eq. 7).
    Raises ValueError for a negative or non-int count or ``lo >= hi``.
    """
    _check_count(n_tokens, "n_tokens")
    if not lo < hi:
        raise ValueError(f"core length thresholds need lo < hi, got lo={lo}, hi={hi}")
    return _clip01((n_tokens - lo) / (hi - lo))


def part_length_penalty(n_tokens: int, expert_tokens: int, *, band_abs: int = 200, band_lo: float = 0.5,
                        band_hi: float = 1.3, r_min: float = 0.2, r_max: float = 2.0) -> float:
    """Non-core LP in [0, 1] against the expert's token count (MemBuilder Eq. 8), ``r = n/expert``:
    0 when ``|n - expert| < band_abs`` or ``band_lo <= r <= band_hi``; linear to 1 at ``r_max``
    above the band and at ``r_min`` below it. An empty expert output gives 0 below ``band_abs``
    tokens, else 1. Raises ValueError for bad counts or thresholds not
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
    """The text a parsed core operation writes: APPEND/REWRITE ``content``, REPLACE ``new_text``,
    NONE "". Raises TypeError for anything that is not a parsed core operation.
    """
    if isinstance(op, (CoreAppend, CoreRewrite)):
        return op.content
    if isinstance(op, CoreReplace):
        return op.new_text
    if isinstance(op, CoreNone):
        return ""
    raise TypeError(f"expected a parsed core operation, got {type(op).__name__}")


def count_tokens(tokenizer, texts: Sequence[str]) -> list[int]:
    """Token counts of ``texts`` under a Hugging Face ``tokenizer`` (one call,
    ``add_special_tokens=False``). Raises TypeError for a non-str text or a non-tokenizer.
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
