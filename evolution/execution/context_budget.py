"""One context budget for every program: what an answer model would read of the retrieved text.

DESIGN.md § "Judges and scoring" (offline proxies): answer-recall and rubric-recall are "scored
within one context budget that is the same for every program, so that returning more text is
not a gain". Without it, a program that returns the first 16,000 characters unranked
(``OUT_CHAR_BUDGET``) scores high on the proxies because more gold tokens happen to be in more
text, which no answer model with a finite context would reward (issue 20: the seed beat every
ranked variant on adversarial questions that way).

:class:`ContextBudget` keeps the longest prefix of a retrieved text that fits in ``tokens``
tokens of a real tokenizer (``smollm2``: SmolLM2-135M-Instruct's, the embedded task model,
from :func:`llm.models.prepare_smollm2_tokenizer`; ``hf:<dir>``: any local tokenizer dir). The
runner applies it between retrieval and the answer/score stages, so the answer model, the
proxy scorer, the reported retrieved length and the diagnostics all see the same text. The cut
is at a token boundary (the fast tokenizer's character offsets); nothing else is changed.
"""
from __future__ import annotations

import threading
from functools import lru_cache

TOKENIZERS = ("smollm2", "hf:<dir>")
_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    if spec == "smollm2":
        from llm.models import prepare_smollm2_tokenizer
        path = prepare_smollm2_tokenizer()
    elif spec.startswith("hf:"):
        from llm.specs import resolve_model_path
        path = resolve_model_path(spec)
    else:
        raise ValueError(f"context_tokenizer must be smollm2 or hf:<dir>, got {spec!r}")
    tok = AutoTokenizer.from_pretrained(str(path))
    if not getattr(tok, "is_fast", False):
        raise ValueError(f"context_tokenizer {spec!r}: a fast tokenizer is needed (character offsets)")
    return tok


def check_tokenizer_spec(spec: str) -> None:
    """ValueError unless ``spec`` is ``smollm2`` or ``hf:<something>`` (loaded lazily)."""
    if spec != "smollm2" and not (spec.startswith("hf:") and len(spec) > 3):
        raise ValueError(f"context_tokenizer must be smollm2 or hf:<dir>, got {spec!r}")


class ContextBudget:
    """Cut retrieved texts to ``tokens`` tokens of ``tokenizer`` (module doc).

    ``tokens``: a positive int (ValueError otherwise). ``identity``: a string naming the budget,
    for reports. :meth:`cut` is thread-safe; the tokenizer loads on first use.
    """

    def __init__(self, tokens: int, tokenizer: str = "smollm2"):
        if not isinstance(tokens, int) or isinstance(tokens, bool) or tokens < 1:
            raise ValueError(f"context_tokens must be a positive int, got {tokens!r}")
        check_tokenizer_spec(tokenizer)
        self.tokens, self.tokenizer = tokens, tokenizer

    @property
    def identity(self) -> str:
        return f"{self.tokens} tokens of {self.tokenizer}"

    def cut(self, text: str) -> str:
        """The longest prefix of ``text`` whose tokens (no special tokens added) number at most
        ``tokens``; ``text`` itself when it fits. Shapes: str → str, len(out) <= len(text)."""
        if not text or len(text.encode("utf-8")) <= self.tokens:  # a token covers at least one byte
            return text
        with _LOCK:
            tok = _load_tokenizer(self.tokenizer)
            enc = tok(text, add_special_tokens=False, return_offsets_mapping=True)
        offsets = enc["offset_mapping"]
        if len(offsets) <= self.tokens:
            return text
        return text[:offsets[self.tokens - 1][1]]
