"""One context budget for every program: the longest prefix of a retrieved text that fits in
``tokens`` tokens of a real tokenizer (``smollm2`` or ``hf:<dir>``), cut at a token boundary.
The program runner applies it between retrieval and the answer/score stages, ``memgym score``
to each context, so returning more text is not a gain on the offline proxies (docs/design.md § "Judges and scoring").
"""
from __future__ import annotations

import threading
from functools import lru_cache

_LOCK = threading.Lock()


@lru_cache(maxsize=4)
def _load_tokenizer(spec: str):
    from transformers import AutoTokenizer

    if spec == "smollm2":
        from memgym.llm.models import prepare_smollm2_tokenizer
        path = prepare_smollm2_tokenizer()
    elif spec.startswith("hf:"):
        from memgym.llm.specs import resolve_model_path
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
    """Cut retrieved texts to ``tokens`` (> 0, else ValueError) tokens of ``tokenizer``;
    ``identity`` names the budget. :meth:`cut` is thread-safe.
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
