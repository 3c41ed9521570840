"""Memory construction: run the four managers session by session and snapshot the bank.

Source: ``DESIGN.md`` § "The memory bank and its action space"; MemBuilder (arXiv 2601.05488
§3.1). Per session the four prompts are built from the bank *before* the session and sent as
one batch; the outputs are then applied in the order core, episodic, semantic, procedural. An
output that fails to parse, validate or apply is a format failure: it is counted and skipped,
and the bank is left as it was.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Protocol

from tqdm.auto import tqdm

from llm.base import Backend, Completion, GenerationParams
from memory_bank.actions import MANAGERS
from memory_bank.bank import MemoryBank
from memory_bank.errors import ManagerOutputError
from memory_bank.prompts import ManagerPrompt, build_prompt, compress_messages
from memory_bank.schema import Conversation, Session


class Extractor(Protocol):
    """Produces the raw text of each manager's output for one session.

    ``extract`` gets the four :class:`ManagerPrompt` (order of :data:`MANAGERS`) and returns
    four outputs in the same order: strings, or :class:`llm.base.Completion` objects whose
    ``finish_reason`` then tells a cut-off output (``truncated``) from a finished one. ``compress(core, target_chars)`` may shorten the core
    block; return None from :meth:`compressor` to disable compression."""

    name: str

    def extract(self, conversation_id: str, session: Session, prompts: list[ManagerPrompt]) -> list[str | Completion]: ...

    def compressor(self): ...


class ModelExtractor:
    """An LLM (any :class:`llm.base.Backend`) as the memory-construction model.

    ``params`` defaults to greedy decoding with 768 new tokens per manager output.
    ``constrained=True`` decodes each manager output under its JSON schema
    (:func:`memory_bank.action_schemas.prompt_schema`: ids narrowed to the ids its prompt
    shows); the core compression call stays free text. ``max_chars`` / ``max_items`` bound
    every string / list of those schemas (:func:`llm.structured.bounded`; None = unbounded)."""

    def __init__(self, backend: Backend, params: GenerationParams | None = None, name: str | None = None,
                 constrained: bool = False, max_chars: int | None = None, max_items: int | None = None):
        self.backend = backend
        self.params = params or GenerationParams(max_new_tokens=768, temperature=0.0)
        self.name = name or backend.model_id
        self.constrained = constrained
        self.bounds = (max_chars, max_items)

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
    ``failures`` count manager outputs (per manager) for the format-failure rate."""

    bank: MemoryBank
    snapshots: list[dict] = field(default_factory=list)
    failures: list[FormatFailure] = field(default_factory=list)
    attempts: dict[str, int] = field(default_factory=lambda: {m: 0 for m in MANAGERS})
    outputs: list[dict[str, str]] = field(default_factory=list)
    empty_sessions: list[int] = field(default_factory=list)

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
    20 entries each manager is shown. Returns a :class:`ConstructionResult` with one bank
    snapshot per session."""
    bank = bank if bank is not None else MemoryBank()
    if bank.compressor is None:
        bank.compressor = extractor.compressor()
    result = ConstructionResult(bank)
    sessions = conversation.sessions[:n_sessions] if n_sessions else conversation.sessions
    for session in tqdm(sessions, desc=f"build {conversation.id}", disable=not progress, unit="session"):
        step_session(bank, conversation.id, session, extractor, result, embedder)
        result.snapshots.append(bank.to_json())
    return result


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
