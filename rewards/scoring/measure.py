"""The one measure step: answer each question from the memory retrieved for it, then score the
answers under one scorer (used by the program runner, the session reward and the training
callback). Source: docs/design.md § "Dense session reward and ADRPO", step 3; MemBuilder §3.3-3.4.
``max_new_tokens`` in answer-model tokens, ``max_context_chars`` in characters.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from memgym.llm.base import Backend, GenerationParams
from memgym.memory_bank.schema import Conversation, QAItem
from memgym.rewards.scoring.answer import ANSWER_SYSTEM_PROMPT, DEFAULT_CONTEXT_CHARS, answer_questions
from memgym.rewards.scoring.judge import Scorer, ScoreItem

__all__ = ["Measured", "answer_items", "score_items", "measure"]


@dataclass
class Measured:
    """One :func:`measure` call: ``predictions`` (one cleaned answer per question; "" when the
    scorer reads only the context and no answer was made), ``scores`` (in [0, 1]) and
    ``judged`` (the scorer's per-item record, its ``last``, when it keeps one, else [])."""

    predictions: list[str]
    scores: list[float]
    judged: list = field(default_factory=list)


def answer_items(backend: Backend, items: Sequence[tuple[str, str, str | None]], params: GenerationParams, *,
                 system_prompt: str = ANSWER_SYSTEM_PROMPT, max_context_chars: int = DEFAULT_CONTEXT_CHARS,
                 batch_size: int | None = None) -> list[str]:
    """Answers to ``items`` = ``[(question, retrieved text, question date or None)]`` from
    ``backend`` (:func:`memgym.rewards.scoring.answer.answer_questions`), in chunks of ``batch_size``
    prompts (None: one call). Returns one cleaned answer per item, in order."""
    items = list(items)
    bs = batch_size or max(1, len(items))
    out: list[str] = []
    for i in range(0, len(items), bs):
        out += answer_questions(backend, items[i: i + bs], params, max_context_chars, system_prompt)
    return out


def score_items(scorer: Scorer, questions: Sequence[QAItem], contexts: Sequence[str],
                predictions: Sequence[str | None],
                conversation: Conversation | Sequence[Conversation | None] | None = None) -> tuple[list[float], list]:
    """``scorer``'s scores of each question's prediction (None reads as "") over its retrieved
    text, in one ``score`` call, and the scorer's per-item records (``last``; [] when it keeps
    none or they do not line up). ``conversation``: the questions' conversation (or one per
    question), whose source text a scorer with ``needs_source`` reads
    (:mod:`memgym.rewards.scoring.grounded`)."""
    convs = list(conversation) if isinstance(conversation, (list, tuple)) else [conversation] * len(questions)
    sources: dict[str, object] = {}
    if getattr(scorer, "needs_source", False):
        from memgym.rewards.scoring.grounded import source_index
        sources = {c.id: source_index(c) for c in {c.id: c for c in convs if c is not None}.values()}
    items = [ScoreItem(q.question, q.answer, p or "", c, q.category or None, q.id, q.rubric, q.evidence,
                       sources.get(conv.id) if conv is not None else None)
             for q, c, p, conv in zip(questions, contexts, predictions, convs)]
    if not items:
        return [], []
    scores = [float(x) for x in scorer.score(items)]
    last = list(getattr(scorer, "last", None) or [])
    return scores, last if len(last) == len(items) else []


def measure(scorer: Scorer, questions: Sequence[QAItem], contexts: Sequence[str], *, answerer: Backend | None = None,
            conversation: Conversation | None = None,
            params: GenerationParams | None = None, system_prompt: str = ANSWER_SYSTEM_PROMPT,
            max_context_chars: int = DEFAULT_CONTEXT_CHARS, batch_size: int | None = None) -> Measured:
    """Answer (when ``scorer.needs_prediction``; ``answerer`` then required, ValueError
    otherwise) and score every question over its retrieved text ``contexts[i]``.
    ``params`` default: greedy, 48 new tokens."""
    if len(questions) != len(contexts):
        raise ValueError(f"measure: {len(questions)} questions but {len(contexts)} contexts")
    preds = [""] * len(questions)
    if scorer.needs_prediction and questions:
        if answerer is None:
            raise ValueError(f"scorer {getattr(scorer, 'name', '?')!r} scores an answer: pass answerer")
        preds = answer_items(answerer, [(q.question, c, q.question_date) for q, c in zip(questions, contexts)],
                             params or GenerationParams(max_new_tokens=48, temperature=0),
                             system_prompt=system_prompt, max_context_chars=max_context_chars, batch_size=batch_size)
    scores, last = score_items(scorer, questions, contexts, preds, conversation)
    return Measured(preds, scores, last)
