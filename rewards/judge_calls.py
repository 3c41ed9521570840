"""Batched judge calls with one retry for unparsable replies, and their accounting.

Source: issue 10 ("judge calls go through the backend and its response cache, batched; an
unparsable judge reply is retried once, then scored 0 and counted in the report"). The retry
appends the unparsable reply and a short reminder of the expected format to the conversation,
so it is a new prompt (a new response-cache key) rather than a replay of the cached reply.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TypeVar

from llm.base import Backend, GenerationParams, LLMError

V = TypeVar("V")

__all__ = ["JudgeStats", "judge_batch"]


@dataclass
class JudgeStats:
    """Counts of one judge's calls over its life: ``prompts`` sent (first tries), ``retried``
    (replies unparsable at the first try, sent again once), ``unparsable`` (still unparsable
    after the retry: scored 0), and up to 5 ``examples`` of unparsable raw replies."""

    prompts: int = 0
    retried: int = 0
    unparsable: int = 0
    examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "retried": self.retried, "unparsable": self.unparsable,
                "examples": list(self.examples)}

    def add(self, other: "JudgeStats") -> None:
        self.prompts += other.prompts
        self.retried += other.retried
        self.unparsable += other.unparsable
        self.examples += other.examples[: max(0, 5 - len(self.examples))]


def _texts(backend: Backend, batch: list[list[dict]], params: GenerationParams) -> list[str]:
    if not batch:
        return []
    out = backend.generate(batch, params)
    if len(out) != len(batch):
        raise LLMError(f"judge backend {getattr(backend, 'model_id', '?')} returned {len(out)} completions "
                       f"for {len(batch)} prompts")
    return [c.text if isinstance(getattr(c, "text", None), str) else "" for c in out]


def judge_batch(backend: Backend, prompts: Sequence[list[dict]], parse: Callable[[str], V | None],
                params: GenerationParams, retry_note: str, stats: JudgeStats | None = None) -> list[V | None]:
    """Send ``prompts`` (chat message lists) as one batched ``generate`` call, parse each reply
    with ``parse`` (returns None when unparsable), resend the unparsable ones once as one more
    batch (the prompt + the bad reply + ``retry_note`` as a user message), and return one
    parsed value per prompt, ``None`` where both tries failed. ``stats`` (if given) is updated.

    Raises:
        LLMError: the backend returned a different number of completions than prompts.
    """
    stats = stats if stats is not None else JudgeStats()
    prompts = list(prompts)
    raw = _texts(backend, prompts, params)
    values = [parse(r) for r in raw]
    stats.prompts += len(prompts)
    bad = [i for i, v in enumerate(values) if v is None]
    if bad:
        stats.retried += len(bad)
        retry = [list(prompts[i]) + [{"role": "assistant", "content": raw[i]}, {"role": "user", "content": retry_note}]
                 for i in bad]
        for i, r in zip(bad, _texts(backend, retry, params)):
            values[i] = parse(r)
            if values[i] is None:
                stats.unparsable += 1
                if len(stats.examples) < 5:
                    stats.examples.append(r[:200])
    return values
