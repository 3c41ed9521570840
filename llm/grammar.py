"""Schema-constrained sampling for the ``hf`` backend: llguidance compiles a JSON schema into a
grammar over the tokenizer and gives, per step, the bitmask of tokens that stay inside it;
:class:`SchemaLogitsProcessor` applies it inside ``model.generate``, one matcher per row."""
from __future__ import annotations

import functools
import threading

from transformers import LogitsProcessor

from memgym.llm.base import LLMError
from memgym.llm.structured import JsonSchema

#: JSON layout the grammar allows: ``json.dumps`` separators, no free whitespace.
JSON_OPTIONS = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(LLMError, ValueError):
    """A schema that llguidance cannot compile, or a matcher that left its grammar."""


def import_llguidance():
    """Import and return ``llguidance`` or raise :class:`GrammarError` with the install hint."""
    try:
        import llguidance
        import llguidance.hf  # noqa: F401
    except ImportError as e:  # pragma: no cover - it is a core dependency
        raise GrammarError(f"constrained decoding on the hf backend needs llguidance: pip install llguidance ({e})") from e
    return llguidance


class SchemaCompiler:
    """Grammars for one tokenizer, compiled once per :attr:`JsonSchema.digest` (LRU 256),
    thread-safe. ``eos_ids`` end a completion once the value is complete. :class:`GrammarError`
    for a slow tokenizer."""

    def __init__(self, tokenizer, eos_ids: list[int], vocab_size: int | None = None):
        llg = import_llguidance()
        self._llg = llg
        try:
            self.lltok = llg.hf.from_tokenizer(tokenizer, n_vocab=vocab_size, eos_token=list(eos_ids))
        except ValueError as e:
            raise GrammarError(f"llguidance needs a fast (Rust) tokenizer: {e}") from e
        self.vocab_size = self.lltok.vocab_size
        self._lock = threading.Lock()
        self._grammar = functools.lru_cache(maxsize=256)(self._compile)

    def _compile(self, digest: str, canonical: str, name: str) -> str:
        grammar = self._llg.LLMatcher.grammar_from_json_schema(canonical, defaults=JSON_OPTIONS)
        is_err, messages = self._llg.LLMatcher.validate_grammar_with_warnings(grammar, self.lltok)
        if is_err:
            raise GrammarError(f"JSON schema {name!r} does not compile to a grammar: {messages}")
        return grammar

    def matcher(self, schema: JsonSchema):
        """A fresh ``llguidance.LLMatcher`` positioned at the start of the schema's value."""
        with self._lock:
            grammar = self._grammar(schema.digest, schema.canonical, schema.name)
        m = self._llg.LLMatcher(self.lltok, grammar)
        if m.is_error():
            raise GrammarError(f"schema {schema.name!r}: {m.get_error()}")
        return m

    def accepts(self, schema: JsonSchema, text: str) -> bool:
        """True iff constrained decoding under ``schema`` could write exactly ``text``."""
        m = self.matcher(schema)
        return bool(m.consume_tokens(self.lltok.tokenize_str(text))) and m.is_accepting()


class SchemaLogitsProcessor(LogitsProcessor):
    """Masks, each step, the tokens that would leave each row's JSON schema.

    ``matchers[i]`` constrains row i (None: free); ``prompt_len`` is the padded prompt length
    (later steps feed each live matcher the last sampled token). Logits beyond the vocabulary are
    masked on constrained rows. :class:`GrammarError` when a matcher rejects an allowed token.
    ``seconds``: cumulative wall time in this processor.
    """

    def __init__(self, matchers: list, prompt_len: int, vocab_size: int):
        import torch

        self.matchers = matchers
        self.rows = [i for i, m in enumerate(matchers) if m is not None]
        self.prompt_len = prompt_len
        self.vocab_size = vocab_size
        self.bitmask = torch.full((len(matchers), (vocab_size + 31) // 32), -1, dtype=torch.int32)
        self._bits = torch.arange(32, dtype=torch.int32)
        self.seconds = 0.0

    def __call__(self, input_ids, scores):
        import time

        t0 = time.perf_counter()
        try:
            return self._mask(input_ids, scores)
        finally:
            self.seconds += time.perf_counter() - t0

    def _mask(self, input_ids, scores):
        import torch

        if not self.rows:
            return scores
        if input_ids.shape[1] > self.prompt_len:
            last = input_ids[:, -1].tolist()
            for i in self.rows:
                m = self.matchers[i]
                if not m.is_stopped() and not m.consume_token(last[i]):
                    raise GrammarError(f"row {i}: token {last[i]} rejected by the grammar: {m.get_error()}")
        from llguidance.torch import fill_next_token_bitmask

        for i in self.rows:
            fill_next_token_bitmask(self.matchers[i], self.bitmask, i)
        rows = torch.tensor(self.rows)
        words = self.bitmask[rows]
        allowed = ((words.unsqueeze(-1) >> self._bits) & 1).bool().reshape(len(self.rows), -1)
        v = min(self.vocab_size, scores.shape[1])
        block = scores[rows]
        block[:, :v] = block[:, :v].masked_fill(~allowed[:, :v], float("-inf"))
        if scores.shape[1] > v:
            block[:, v:] = float("-inf")
        scores[rows] = block
        return scores
