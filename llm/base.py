"""The one backend protocol through which memgym talks to language models.

Source: ``DESIGN.md`` § "LLM backends". Every role (policy, task, expert, judge, coder,
annotator) is served by an object implementing :class:`Backend`.
Token counts are in the backend model's own tokenizer tokens.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

Message = dict  # {"role": "system"|"user"|"assistant", "content": str}
Messages = list  # list[Message]


class LLMError(RuntimeError):
    """Base class of backend errors."""


class BackendRequestError(LLMError):
    """A request failed after the last retry. ``attempts`` says how many were made."""

    def __init__(self, message: str, attempts: int = 1):
        super().__init__(message)
        self.attempts = attempts


class BackendSpecError(LLMError, ValueError):
    """A backend spec string (``hf:<path>``, ``openai:<url>#<model>``) is malformed."""


class TruncatedOutputError(ValueError):
    """A model output that was cut off before it finished: the completion stopped on the
    token limit (``finish_reason == "length"``) or its text ends inside an unterminated JSON
    string, object or array. ``error_type`` is always ``"truncated"``: the one error kind
    every caller (manager-output parsing, judges, program records, structured outputs) uses
    for cut-off outputs, so reports and format gates count them the same way.
    Raise it from a completion with :func:`require_complete`."""

    error_type = "truncated"


def require_complete(completion: "Completion", what: str = "output") -> str:
    """``completion.text`` when the completion finished on its own; raises
    :class:`TruncatedOutputError` (naming ``what`` and the token count) when it stopped on
    the length limit."""
    if completion.truncated:
        raise TruncatedOutputError(
            f"{what} was cut off by the token limit after {completion.completion_tokens} tokens "
            f"(finish_reason 'length'); raise max_new_tokens")
    return completion.text


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters. ``temperature == 0`` means greedy decoding.

    max_new_tokens: completion budget in tokens (>= 1). top_p in (0, 1]. ``seed`` makes
    sampling reproducible where the backend supports it.
    """

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    #: Part of the response-cache key only (never sent to a model): e.g. a judge protocol's name,
    #: so replies obtained under one protocol are never replayed under another. None = no tag
    #: (and the key is what it was before the field existed, so old caches stay valid).
    cache_tag: str | None = None

    def __post_init__(self):
        if self.max_new_tokens < 1:
            raise ValueError(f"GenerationParams.max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"GenerationParams.temperature must be >= 0, got {self.temperature}")
        if not (0 < self.top_p <= 1):
            raise ValueError(f"GenerationParams.top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def to_dict(self) -> dict:
        """The fields as a dict; ``cache_tag`` only when set (see the field)."""
        d = asdict(self)
        if d["cache_tag"] is None:
            del d["cache_tag"]
        return d


@dataclass(frozen=True)
class Completion:
    """One generated answer. ``cached`` is True when it came from the response cache.
    ``finish_reason``: ``"stop"`` (the model ended it) or ``"length"`` (cut off at
    ``max_new_tokens``; see :attr:`truncated`)."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    cached: bool = False

    @property
    def truncated(self) -> bool:
        """True when generation stopped on the token limit, not on its own."""
        return self.finish_reason == "length"


@runtime_checkable
class Backend(Protocol):
    """``generate`` returns one :class:`Completion` per input conversation, in order.

    ``model_id`` names the model for cache keys and reports; ``calls`` counts model
    calls actually made (a cache hit is not a call).
    """

    model_id: str
    calls: int

    def generate(self, batch: list[Messages], params: GenerationParams) -> list[Completion]: ...


@runtime_checkable
class Embedder(Protocol):
    """Sentence embedder. ``encode`` returns a float32 array of shape (len(texts), dim),
    each row L2-normalised (so a dot product is a cosine). ``calls`` counts encode
    batches that reached the model (cache hits excluded)."""

    dim: int
    calls: int

    def encode(self, texts: list[str]) -> "np.ndarray": ...  # noqa: F821


@dataclass
class CallTally:
    """Model-call accounting of a run: completions served by the model vs by the response
    cache, and the tokens the model calls cost (cache hits cost none)."""

    model_calls: int = 0
    cached_completions: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0

    def book(self, comp: Completion) -> None:
        """Count one completion."""
        if comp.cached:
            self.cached_completions += 1
        else:
            self.model_calls += 1
            self.prompt_tokens += comp.prompt_tokens
            self.completion_tokens += comp.completion_tokens
