"""The one backend protocol (:class:`Backend`) serving every language-model role, and the
validation of chat batches before they reach any backend (:func:`check_batch`); token counts are
in the backend model's own tokenizer."""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable

from memgym.llm.errors import MemgymError

Messages = list  # list[{"role": "system"|"user"|"assistant", "content": str}]
ROLES = ("system", "user", "assistant", "tool")


class LLMError(MemgymError, RuntimeError):
    """Base class of backend errors."""

    kind = "backend"


class BackendRequestError(LLMError):
    """A request failed after the last retry. ``attempts`` says how many were made."""

    def __init__(self, message: str, attempts: int = 1):
        super().__init__(message)
        self.attempts = attempts


class BackendSpecError(LLMError, ValueError):
    """A backend spec string (``hf:<path>``, ``openai:<url>#<model>``) is malformed."""


class TruncatedOutputError(MemgymError, ValueError):
    """A model output cut off on the token limit or inside unterminated JSON; ``error_type``
    ``"truncated"`` for every caller."""

    kind = "truncated"

    error_type = "truncated"


def require_complete(completion: "Completion", what: str = "output") -> str:
    """``completion.text``, or :class:`TruncatedOutputError` when it stopped on the length limit."""
    if completion.truncated:
        raise TruncatedOutputError(
            f"{what} was cut off by the token limit after {completion.completion_tokens} tokens "
            f"(finish_reason 'length'); raise max_new_tokens")
    return completion.text


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
                raise BatchError(f"batch[{i}][{j}]['content'] must be a str, got {type(msg.get('content')).__name__}")


@dataclass(frozen=True)
class GenerationParams:
    """Sampling parameters: max_new_tokens >= 1, temperature >= 0 (0 = greedy), top_p in (0, 1],
    ``seed`` for reproducible sampling where supported."""

    max_new_tokens: int = 256
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int | None = None
    #: Part of the response-cache key only (never sent), e.g. a judge protocol's name.
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
        """The fields as a dict; ``cache_tag`` only when set."""
        d = asdict(self)
        if d["cache_tag"] is None:
            del d["cache_tag"]
        return d


@dataclass(frozen=True)
class Completion:
    """One generated answer; ``finish_reason`` ``"stop"`` or ``"length"``; ``cached``: from the
    cache; ``estimated``: the token counts are estimates (:func:`memgym.llm.models.estimate_tokens`)
    because the server's own counts were missing or failed :func:`token_count_problem`."""

    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    finish_reason: str = "stop"
    cached: bool = False
    estimated: bool = False

    @property
    def truncated(self) -> bool:
        """True when generation stopped on the token limit, not on its own."""
        return self.finish_reason == "length"


#: Tokens a chat template may add to a prompt beyond its contents' bytes (role markers, a default
#: system prompt such as Qwen's or Llama 3's date header, a tool or schema preamble): generous,
#: it only separates an absurd count from a real one.
TEMPLATE_TOKENS = 4096


def prompt_token_limit(messages) -> int:
    """The most tokens a prompt of ``messages`` can have: its contents' UTF-8 bytes (a byte-level
    BPE token covers at least one byte, the rule memgym's context budget also relies on) plus
    :data:`TEMPLATE_TOKENS`."""
    return sum(len(str(m.get("content", "")).encode("utf-8")) for m in messages) + TEMPLATE_TOKENS


def token_count_problem(value, *, most: int, nonempty: bool) -> str:
    """Why ``value`` cannot be a token count ("" when it can): not an int (a bool, a string, a
    float, None), negative, 0 for a non-empty text (``nonempty``: a non-empty text has a
    token), or above ``most`` (:func:`prompt_token_limit` for a prompt, ``max_new_tokens`` for
    a completion). A server's or a recording's count that fails is never booked."""
    if isinstance(value, bool) or not isinstance(value, int):
        return f"{value!r} is not an integer"
    if value < 0:
        return f"{value:,} is negative"
    if value == 0 and nonempty:
        return "0 for a non-empty text"
    if value > most:
        return f"{value:,} is above the possible {most:,}"
    return ""


@runtime_checkable
class Backend(Protocol):
    """``generate`` returns one :class:`Completion` per conversation, in order; ``model_id`` keys
    caches and reports; ``calls`` counts model calls made (not cache hits)."""

    model_id: str
    calls: int

    def generate(self, batch: list[Messages], params: GenerationParams) -> list[Completion]: ...


@runtime_checkable
class Embedder(Protocol):
    """``encode`` returns float32 (len(texts), dim), rows L2-normalised; ``calls`` counts model batches."""

    dim: int
    calls: int

    def encode(self, texts: list[str]) -> "np.ndarray": ...  # noqa: F821


@dataclass
class CallTally:
    """Completions served by the model vs the cache, and the model calls' tokens."""

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
