"""Answering a question from retrieved memory with an LLM backend.

Source: docs/design.md § "Dense session reward and ADRPO", step 3 (acc = judge(answer(q, retrieve(bank, q)), a)).
The prompt wording is memgym's own. The abstention phrase it asks for, "No information
available", is the one LoCoMo's category-5 rule accepts (see :mod:`memgym.rewards.scoring.metrics`).
All budgets here are in characters, except ``max_new_tokens`` (tokens of the answer model).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from memgym.llm.base import Backend, GenerationParams, LLMError

__all__ = ["DEFAULT_CONTEXT_CHARS", "ANSWER_SYSTEM_PROMPT", "BEAM_ANSWER_SYSTEM_PROMPT", "answer_system_prompt",
           "truncate_context", "build_answer_messages", "strip_thinking", "clean_answer", "answer_questions"]

#: Default character budget of the memory context shown to the answer model.
DEFAULT_CONTEXT_CHARS = 6000

ANSWER_SYSTEM_PROMPT = (
    "You answer questions about a long conversation using only the memory notes you are given. "
    "Reply with a short answer (a few words or one short sentence), with no explanation. "
    "If the memory does not contain the answer, reply exactly: No information available"
)

#: BEAM asks for orders of events, lists and summaries as well as facts (memgym's wording): a
#: one-line answer would fail those questions before the judge sees them.
BEAM_ANSWER_SYSTEM_PROMPT = (
    "You answer a user's request about their long chat history using only the memory notes you are given. "
    "Give the complete answer the request asks for: a fact in a few words; an order of events, a list or a "
    "summary with one item per line, in order. No explanation of how you found it. "
    "If the memory does not contain the answer, reply exactly: No information available"
)


def answer_system_prompt(dataset: str | None) -> str:
    """The answer model's system prompt for ``dataset``: :data:`BEAM_ANSWER_SYSTEM_PROMPT` for
    BEAM, :data:`ANSWER_SYSTEM_PROMPT` (short answers) otherwise."""
    return BEAM_ANSWER_SYSTEM_PROMPT if dataset == "beam" else ANSWER_SYSTEM_PROMPT


_THINK_BLOCK = re.compile(r"<think(?:ing)?>.*?</think(?:ing)?>", re.DOTALL | re.IGNORECASE)
_THINK_OPEN = re.compile(r"<think(?:ing)?>", re.IGNORECASE)
_THINK_CLOSE = re.compile(r"</think(?:ing)?>", re.IGNORECASE)
_ANSWER_PREFIX = re.compile(r"^\s*(?:\*\*)?\s*(?:final\s+)?answer\s*(?:\*\*)?\s*[:：]\s*(?:\*\*)?", re.IGNORECASE)


def truncate_context(context: str, max_chars: int = DEFAULT_CONTEXT_CHARS) -> str:
    """The first ``max_chars`` characters of ``context``, cut back to a newline in the second half
    when there is one. Raises ValueError if ``max_chars < 1``, TypeError for a non-str.
    """
    if not isinstance(context, str):
        raise TypeError(f"context must be a str, got {type(context).__name__}")
    if max_chars < 1:
        raise ValueError(f"max_chars must be >= 1, got {max_chars}")
    if len(context) <= max_chars:
        return context
    head = context[:max_chars]
    nl = head.rfind("\n")
    if nl >= max_chars // 2:
        head = head[:nl]
    return head.rstrip()


def build_answer_messages(question: str, context: str, question_date: str | None = None,
                          max_context_chars: int = DEFAULT_CONTEXT_CHARS,
                          system_prompt: str = ANSWER_SYSTEM_PROMPT) -> list[dict]:
    """System + user messages asking ``question`` over ``context`` (cut to ``max_context_chars``),
    showing ``question_date`` when given. Raises TypeError / ValueError for bad arguments.
    """
    if not isinstance(question, str):
        raise TypeError(f"question must be a str, got {type(question).__name__}")
    if not question.strip():
        raise ValueError("question is empty")
    if question_date is not None and not isinstance(question_date, str):
        raise TypeError(f"question_date must be a str or None, got {type(question_date).__name__}")
    memory = truncate_context(context, max_context_chars).strip() or "(empty)"
    parts = [f"Memory:\n{memory}", ""]
    if question_date:
        parts.append(f"Current date: {question_date}")
    parts.append(f"Question: {question}")
    parts.append("Short answer:")
    return [
        {"role": "system", "content": system_prompt},
        {"role": "user", "content": "\n".join(parts)},
    ]


def strip_thinking(text: str) -> str:
    """``text`` without ``<think>``/``<thinking>`` blocks (an unclosed tag drops the rest, a stray
    closing tag drops what precedes it); unstripped.
    """
    text = _THINK_BLOCK.sub("", text)
    close = list(_THINK_CLOSE.finditer(text))
    if close:
        text = text[close[-1].end():]
    m = _THINK_OPEN.search(text)
    if m:
        text = text[: m.start()]
    return text


def clean_answer(raw: str) -> str:
    """The judged answer of a raw output: no thinking, no "Answer:" prefix on the first line, no
    surrounding whitespace/quotes; all lines kept. "" when nothing is left or for non-str input.
    """
    if not isinstance(raw, str):
        return ""
    text = strip_thinking(raw).strip()
    if not text:
        return ""
    first, nl, rest = text.partition("\n")
    first = _ANSWER_PREFIX.sub("", first, count=1).strip()
    text = (first + nl + rest).strip() if first else rest.strip()
    return text.strip("\"'`").strip()


def check_triples(items, names: tuple[str, str, str]) -> list[tuple]:
    """``items`` as a list of 3-tuples named ``names`` (e.g. question, context, date). Raises
    TypeError when ``items`` is not a list, ValueError naming the index of an item that is not
    a triple; callers check the three values."""
    if not isinstance(items, Sequence) or isinstance(items, str):
        raise TypeError(f"items must be a list of ({', '.join(names)}) tuples, got {type(items).__name__}")
    for i, item in enumerate(items):
        if not isinstance(item, (tuple, list)) or len(item) != 3:
            raise ValueError(f"items[{i}] must be a ({', '.join(names)}) triple, got {item!r:.120}")
    return [tuple(item) for item in items]


def _check_items(items) -> list[tuple[str, str, str | None]]:
    out = []
    for i, (q, ctx, qdate) in enumerate(check_triples(items, ("question", "context", "question_date"))):
        if not isinstance(q, str) or not q.strip():
            raise ValueError(f"items[{i}].question must be a non-empty str, got {q!r:.80}")
        if not isinstance(ctx, str):
            raise TypeError(f"items[{i}].context must be a str, got {type(ctx).__name__}")
        if qdate is not None and not isinstance(qdate, str):
            raise TypeError(f"items[{i}].question_date must be a str or None, got {type(qdate).__name__}")
        out.append((q, ctx, qdate))
    return out


def answer_questions(backend: Backend, items: list[tuple[str, str, str | None]],
                     params: GenerationParams = GenerationParams(max_new_tokens=48, temperature=0),
                     max_context_chars: int = DEFAULT_CONTEXT_CHARS,
                     system_prompt: str = ANSWER_SYSTEM_PROMPT) -> list[str]:
    """One cleaned answer per (question, context, question_date), from one batched ``generate``.
    Raises ValueError/TypeError before any call, :class:`memgym.llm.base.LLMError` on a count mismatch.
    """
    checked = _check_items(items)
    if not checked:
        return []
    batch = [build_answer_messages(q, ctx, qd, max_context_chars, system_prompt) for q, ctx, qd in checked]
    completions = backend.generate(batch, params)
    if len(completions) != len(batch):
        raise LLMError(
            f"answer backend {getattr(backend, 'model_id', '?')} returned {len(completions)} "
            f"completions for {len(batch)} prompts"
        )
    return [clean_answer(getattr(c, "text", None)) for c in completions]
