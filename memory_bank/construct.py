"""Memory construction (MemBuilder, arXiv 2601.05488 §3.1): per session the four managers'
prompts are built from the bank *before* the session, sent as one batch and applied in the order
core, episodic, semantic, procedural; an output that fails is a counted format failure and leaves
the bank as it was. A session that does not fit the extractor's context is never truncated: it
is built in segments of whole turns (a too-long turn in ``(part i/k)`` pieces); an extractor with
``segment_tokens`` cuts every session so (:func:`split_session`).
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tqdm.auto import tqdm

from memgym.llm.base import Backend, Completion, GenerationParams
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.errors import ManagerOutputError
from memgym.memory_bank.prompts import ManagerPrompt, build_prompt, compress_messages
from memgym.memory_bank.schema import Conversation, Session, Turn


class Extractor(Protocol):
    """Produces the raw text of each manager's output for one session: ``extract`` maps the four
        :class:`ManagerPrompt` (order of :data:`MANAGERS`) to four strings or
        :class:`memgym.llm.base.Completion` s. ``compressor()`` may return a core compressor (or None). With a
        finite context it also has ``prompt_budget()`` and ``prompt_tokens(messages)``."""

    name: str

    def extract(self, conversation_id: str, session: Session, prompts: list[ManagerPrompt]) -> list[str | Completion]: ...

    def compressor(self): ...


def backend_context_tokens(backend) -> int | None:
    """A backend's context window in tokens (``context_tokens`` or the model's
        ``max_position_embeddings``, through ``inner``/``backend`` wrappers), else None."""
    seen = 0
    while backend is not None and seen < 5:
        n = getattr(backend, "context_tokens", None)
        if isinstance(n, int) and n > 0:
            return n
        cfg = getattr(getattr(backend, "model", None), "config", None)
        n = getattr(cfg, "max_position_embeddings", None)
        if isinstance(n, int) and n > 0:
            return n
        backend = getattr(backend, "inner", None) or getattr(backend, "backend", None)
        seen += 1
    return None


class ModelExtractor:
    """An LLM (any :class:`memgym.llm.base.Backend`) as the memory-construction model.

        ``params``: default greedy, 768 new tokens. ``constrained``: each manager output decoded under
        :func:`memgym.memory_bank.action_schemas.prompt_schema`, strings/lists bounded by ``max_chars`` /
        ``max_items``. ``context_tokens``: default :func:`backend_context_tokens` (None: never
        segmented). ``segment_tokens``: cut every session as segmented SFT does
        (``memgym.training.sft_segments``). ValueError when it is < 1 or the context does not exceed the
        output budget. Prompts are measured with the backend's tokenizer, else characters / 3."""

    def __init__(self, backend: Backend, params: GenerationParams | None = None, name: str | None = None,
                 constrained: bool = False, max_chars: int | None = None, max_items: int | None = None,
                 context_tokens: int | None = None, segment_tokens: int | None = None):
        self.backend = backend
        if segment_tokens is not None and segment_tokens < 1:
            raise ValueError(f"segment_tokens must be >= 1 or None, got {segment_tokens}")
        self.segment_tokens = segment_tokens
        self.params = params or GenerationParams(max_new_tokens=768, temperature=0.0)
        self.name = name or backend.model_id
        self.constrained = constrained
        self.bounds = (max_chars, max_items)
        if context_tokens is not None and context_tokens <= self.params.max_new_tokens:
            raise ValueError(f"context_tokens ({context_tokens}) must exceed the output budget "
                             f"({self.params.max_new_tokens} tokens)")
        self.context_tokens = context_tokens if context_tokens is not None else backend_context_tokens(backend)

    def prompt_budget(self) -> int | None:
        """Tokens a prompt may take: the context minus the output budget (None = unlimited)."""
        return None if self.context_tokens is None else self.context_tokens - self.params.max_new_tokens

    def text_tokens(self, text: str) -> int:
        """Tokens of a bare text (no chat wrapper); characters / 3 without a tokenizer."""
        tok = getattr(self.backend, "tokenizer", None)
        if tok is not None:
            return len(tok(text, add_special_tokens=False)["input_ids"])
        return len(text) // 3 + 1

    def prompt_tokens(self, messages: list[dict]) -> int:
        """Tokens of ``messages`` as the model sees them (chat template + generation prompt)."""
        tok = getattr(self.backend, "tokenizer", None)
        if tok is not None and getattr(tok, "chat_template", None):
            ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = ids["input_ids"] if isinstance(ids, dict) or hasattr(ids, "keys") else ids
            return len(ids)
        return sum(len(m["content"]) for m in messages) // 3 + 8 * len(messages)

    def extract(self, conversation_id, session, prompts):
        batch = [p.messages for p in prompts]
        if self.constrained:
            from memgym.llm.structured import bounded
            from memgym.memory_bank.action_schemas import prompt_schema

            comps = self.backend.generate(batch, self.params,
                                          schemas=[bounded(prompt_schema(p), *self.bounds) for p in prompts])
        else:
            comps = self.backend.generate(batch, self.params)
        return comps  # Completions: finish_reason tells a cut-off output (truncated)

    def compressor(self):
        def compress(core: str, target: int) -> str:
            comp = self.backend.generate([compress_messages(core, target)], self.params)[0]
            # a cut-off compression is a failed one: the bank then keeps the head of the block
            return "" if comp.truncated else comp.text.strip()
        return compress


@dataclass
class FormatFailure:
    session: int
    manager: str
    error_type: str
    message: str


@dataclass
class ConstructionResult:
    """``snapshots[i]``: the bank JSON after the i-th session; ``attempts`` / ``failures`` per
        manager; ``segments[session index]``: manager steps taken; ``outputs``: one per step."""

    bank: MemoryBank
    snapshots: list[dict] = field(default_factory=list)
    failures: list[FormatFailure] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=lambda: {m: 0 for m in MANAGERS})
    outputs: list[dict[str, str]] = field(default_factory=list)
    empty_sessions: list[int] = field(default_factory=list)
    segments: dict[int, int] = field(default_factory=dict)


def construct(conversation: Conversation, extractor: Extractor, *, n_sessions: int | None = None,
              embedder=None, bank: MemoryBank | None = None, progress: bool = False) -> ConstructionResult:
    """Build the bank of ``conversation`` over its first ``n_sessions`` (``embedder`` ranks the 20
        entries each manager sees); segments sessions that do not fit."""
    bank = bank if bank is not None else MemoryBank()
    if bank.compressor is None:
        bank.compressor = extractor.compressor()
    result = ConstructionResult(bank)
    sessions = conversation.sessions[:n_sessions] if n_sessions else conversation.sessions
    for session in tqdm(sessions, desc=f"build {conversation.id}", disable=not progress, unit="session"):
        result.segments[session.index] = sum(
            step_session_segmented(bank, conversation.id, part, extractor, result, embedder)
            for part in fixed_segments(session, extractor))
        result.snapshots.append(bank.to_json())
    return result


def split_session(session: Session, turn_tokens: Sequence[int], segment_tokens: int) -> list[Session]:
    """``session`` in consecutive segments of whole turns of at most ``segment_tokens``
        (``turn_tokens[i]`` per turn; a longer turn is its own segment). ValueError for bad input."""
    if segment_tokens < 1:
        raise ValueError(f"segment_tokens must be >= 1, got {segment_tokens}")
    if len(turn_tokens) != len(session.turns):
        raise ValueError(f"{len(turn_tokens)} turn lengths for {len(session.turns)} turns")
    groups: list[list] = []
    used = 0
    for turn, n in zip(session.turns, turn_tokens):
        if groups and used + n <= segment_tokens:
            groups[-1].append(turn)
            used += n
        else:
            groups.append([turn])
            used = n
    if len(groups) <= 1:
        return [session]
    return [dataclasses.replace(session, turns=tuple(g)) for g in groups]


def fixed_segments(session: Session, extractor) -> list[Session]:
    """The session cut by the extractor's ``segment_tokens`` (a turn counts its line's tokens + 1,
        as ``memgym.training.sft_segments`` does), else ``[session]``."""
    n = getattr(extractor, "segment_tokens", None)
    if not n or not session.turns:
        return [session]
    return split_session(session, [extractor.text_tokens(t.render()) + 1 for t in session.turns], n)


#: The fewest transcript tokens a segment must have room for (else construction stops with an error).
MIN_SEGMENT_TOKENS = 64


def _max_prompt_tokens(extractor, bank: MemoryBank, session: Session, embedder) -> int:
    return max(extractor.prompt_tokens(build_prompt(m, bank, session, embedder).messages) for m in MANAGERS)


def _split_turn(turn: Turn, parts: int) -> list[Turn]:
    size = -(-len(turn.text) // parts)
    chunks = [turn.text[i:i + size] for i in range(0, len(turn.text), size)]
    return [dataclasses.replace(turn, text=f"(part {k}/{len(chunks)}) {c}") for k, c in enumerate(chunks, 1)]


def step_session_segmented(bank: MemoryBank, conversation_id: str, session: Session, extractor,
                           result: ConstructionResult, embedder=None) -> int:
    """Run the managers on ``session`` in segments that fit :meth:`prompt_budget` with the bank
        as it stands; returns the segment count. ValueError when the bank alone leaves fewer than
        :data:`MIN_SEGMENT_TOKENS` tokens.
        """
    budget = extractor.prompt_budget() if hasattr(extractor, "prompt_budget") else None
    if budget is None or _max_prompt_tokens(extractor, bank, session, embedder) <= budget:
        step_session(bank, conversation_id, session, extractor, result, embedder)
        return 1
    def cost(t: Turn) -> int:  # a turn's tokens as one transcript line, its newline included
        return extractor.text_tokens(t.render()) + 1

    turns = list(session.turns)
    costs = [cost(t) for t in turns]
    n = 0
    while turns:
        empty = _max_prompt_tokens(extractor, bank, dataclasses.replace(session, turns=()), embedder)
        room = budget - empty
        if room < MIN_SEGMENT_TOKENS:
            raise ValueError(f"{conversation_id} session {session.index}: the managers' prompt without any turn "
                             f"takes {empty} tokens, leaving {room} of the extractor's budget of {budget} for the "
                             f"transcript (at least {MIN_SEGMENT_TOKENS} needed)")
        end, used = 0, 0
        while end < len(costs) and used + costs[end] <= room:
            used += costs[end]
            end += 1
        while end > 0 and _max_prompt_tokens(extractor, bank, dataclasses.replace(session, turns=tuple(turns[:end])),
                                             embedder) > budget:
            end -= 1  # per-turn estimates ignore the bank entries a segment selects: shrink until it fits
        if end == 0:  # the first turn does not fit alone: split its text into parts that do
            parts = _split_turn(turns[0], max(2, -(-costs[0] // max(1, room * 3 // 4))))
            turns[:1], costs[:1] = parts, [cost(t) for t in parts]
            continue
        step_session(bank, conversation_id, dataclasses.replace(session, turns=tuple(turns[:end])), extractor,
                     result, embedder)
        turns, costs = turns[end:], costs[end:]
        n += 1
    return n


def step_session(bank: MemoryBank, conversation_id: str, session: Session, extractor: Extractor,
                 result: ConstructionResult, embedder=None) -> None:
    """Run the four managers on one session and apply their outputs in place (no turns: no call,
        recorded in ``result.empty_sessions`` with a warning)."""
    if not session.turns:
        warnings.warn(f"{conversation_id} session {session.index} ({session.id}) has no turns; skipped (no "
                      "extractor call)", stacklevel=2)
        result.empty_sessions.append(session.index)
        result.outputs.append({})
        return
    prompts = [build_prompt(m, bank, session, embedder) for m in MANAGERS]
    outs = extractor.extract(conversation_id, session, prompts)
    if len(outs) != len(MANAGERS):
        raise RuntimeError(f"extractor {extractor.name} returned {len(outs)} outputs, expected {len(MANAGERS)}")
    texts = [o.text if isinstance(o, Completion) else o for o in outs]
    reasons = [o.finish_reason if isinstance(o, Completion) else None for o in outs]
    result.outputs.append(dict(zip(MANAGERS, texts)))
    for manager, text, reason in zip(MANAGERS, texts, reasons):
        result.attempts[manager] += 1
        try:
            bank.apply_text(manager, text, session.index, finish_reason=reason)
        except ManagerOutputError as e:
            result.failures.append(FormatFailure(session.index, manager, e.error_type, str(e)))
