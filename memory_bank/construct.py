"""Memory construction: run the four managers session by session and snapshot the bank.

Source: ``DESIGN.md`` § "The memory bank and its action space"; MemBuilder (arXiv 2601.05488
§3.1). Per session the four prompts are built from the bank *before* the session and sent as
one batch; the outputs are then applied in the order core, episodic, semantic, procedural. An
output that fails to parse, validate or apply is a format failure: it is counted and skipped,
and the bank is left as it was.

Sessions beyond the extractor's context (BEAM sessions run to tens of thousands of tokens) are
never truncated: a session whose largest manager prompt plus the output budget does not fit the
extractor's context window is split into consecutive segments of whole turns, each one
manager step over the bank as it stands (a single turn too long on its own is split into
consecutive parts of its text, marked ``(part i/k)``). :attr:`ConstructionResult.segments`
counts the segments of every session. An extractor with ``segment_tokens`` (a model trained on
segmented sessions, ``training.sft_segments``) has every session cut into segments of at most
that many transcript tokens first (:func:`split_session`).
"""
from __future__ import annotations

import dataclasses
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from tqdm.auto import tqdm

from llm.base import Backend, Completion, GenerationParams
from memory_bank.actions import MANAGERS
from memory_bank.bank import MemoryBank
from memory_bank.errors import ManagerOutputError
from memory_bank.prompts import ManagerPrompt, build_prompt, compress_messages
from memory_bank.schema import Conversation, Session, Turn


class Extractor(Protocol):
    """Produces the raw text of each manager's output for one session.

    ``extract`` gets the four :class:`ManagerPrompt` (order of :data:`MANAGERS`) and returns
    four outputs in the same order: strings, or :class:`llm.base.Completion` objects whose
    ``finish_reason`` then tells a cut-off output (``truncated``) from a finished one.
    ``compress(core, target_chars)`` may shorten the core block; return None from
    :meth:`compressor` to disable compression. An extractor with a finite context also has
    ``prompt_budget()`` (tokens a prompt may take, or None) and ``prompt_tokens(messages)``;
    :func:`construct` then segments sessions that do not fit."""

    name: str

    def extract(self, conversation_id: str, session: Session, prompts: list[ManagerPrompt]) -> list[str | Completion]: ...

    def compressor(self): ...


def backend_context_tokens(backend) -> int | None:
    """The context window (tokens) a backend reports: its ``context_tokens`` attribute, or its
    transformers model's ``config.max_position_embeddings``, looking through wrappers
    (role / cache wrappers expose ``inner`` or ``backend``). None when nothing says."""
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
    """An LLM (any :class:`llm.base.Backend`) as the memory-construction model.

    ``params`` defaults to greedy decoding with 768 new tokens per manager output.
    ``constrained=True`` decodes each manager output under its JSON schema
    (:func:`memory_bank.action_schemas.prompt_schema`: ids narrowed to the ids its prompt
    shows); the core compression call stays free text. ``max_chars`` / ``max_items`` bound
    every string / list of those schemas (:func:`llm.structured.bounded`; None = unbounded).
    ``context_tokens``: the model's context window in tokens (default
    :func:`backend_context_tokens`; None = unknown, sessions are then never segmented).
    ``segment_tokens``: when set, every session is built in segments of whole turns of at most
    this many transcript tokens (:func:`split_session`), whether or not it fits the context:
    the cut of segmented SFT (``training.sft_segments``), so a model trained on segments is run
    on the same kind of prompt (None = whole sessions while they fit). Raises ValueError when
    it is < 1 or ``context_tokens`` does not exceed the output budget.
    Prompt lengths are counted with the backend's tokenizer (its chat template), or as
    characters / 3 (a conservative estimate) when it has none."""

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
            from llm.structured import bounded
            from memory_bank.action_schemas import prompt_schema

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
    """``snapshots[i]`` is the bank JSON after the i-th processed session; ``attempts`` and
    ``failures`` count manager outputs (per manager) for the format-failure rate;
    ``segments[session index]`` is the number of manager steps the session took (1 when it
    fit the extractor's context); ``outputs`` has one entry per step."""

    bank: MemoryBank
    snapshots: list[dict] = field(default_factory=list)
    failures: list[FormatFailure] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=lambda: {m: 0 for m in MANAGERS})
    outputs: list[dict[str, str]] = field(default_factory=list)
    empty_sessions: list[int] = field(default_factory=list)
    segments: dict[int, int] = field(default_factory=dict)

    @property
    def n_segments(self) -> int:
        """Manager steps over all sessions (= sessions when none was split)."""
        return sum(self.segments.values())

    def format_failure_rate(self) -> dict[str, float]:
        """Per manager: failed outputs / outputs, in [0, 1] (0.0 when no output was made)."""
        fails = {m: 0 for m in MANAGERS}
        for f in self.failures:
            fails[f.manager] += 1
        return {m: (fails[m] / self.attempts[m] if self.attempts[m] else 0.0) for m in MANAGERS}


def construct(conversation: Conversation, extractor: Extractor, *, n_sessions: int | None = None,
              embedder=None, bank: MemoryBank | None = None, progress: bool = False) -> ConstructionResult:
    """Build the bank of ``conversation`` session by session.

    ``n_sessions`` limits the run to the first N sessions; ``embedder`` (optional) ranks the
    20 entries each manager is shown. A session that does not fit the extractor's context is
    built in segments (module docstring). Returns a :class:`ConstructionResult` with one bank
    snapshot per session and the segment count of each."""
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
    """``session`` cut into consecutive segments of whole turns, each holding at most
    ``segment_tokens`` tokens (``turn_tokens[i]``: tokens of turn i's transcript line); a turn
    longer than that on its own is its own segment. One segment (the session) when it fits.
    Raises ValueError when ``segment_tokens`` < 1 or the lengths do not match the turns."""
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
    """The session cut by the extractor's ``segment_tokens`` (:func:`split_session`, one turn
    = its transcript line's tokens + 1 for the newline, as ``training.sft_segments`` counts),
    or ``[session]`` when the extractor has none or the session has no turns."""
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
    """Run the managers on ``session``, in consecutive segments when its prompts do not fit
    the extractor's :meth:`prompt_budget`; returns the number of segments (>= 1).

    Each segment holds as many whole turns as fit with the bank as it stands before that
    segment (the prompt of every manager is measured); a turn that does not fit alone is split
    into parts of its text. Raises ValueError when an empty segment's prompt (the bank shown to
    the managers) leaves fewer than :data:`MIN_SEGMENT_TOKENS` tokens of the budget.
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
    """Run the four managers on one session and apply their outputs (in place). A session
    with no turns costs no model call: it is recorded in ``result.empty_sessions`` (with a
    warning) and the bank is left as it was."""
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
