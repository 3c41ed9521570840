"""Manager prompts (our own wording), the same for inference, SFT and ADRPO rollouts: each
manager sees the session date and transcript, the core block and up to 20 of its part's entries
most similar to the session, as ``[E3] text``."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from memgym.memory_bank.actions import MANAGERS, PARTS
from memgym.memory_bank.bank import CORE_LIMIT_CHARS, Entry, MemoryBank
from memgym.memory_bank.schema import Session

MAX_SHOWN_ENTRIES = 20

_COMMON = (
    "You maintain one part of a long-term memory bank about a conversation between people. "
    "Read the new session and decide how this part should change. "
    "Reply with a single JSON object and nothing else."
)

SYSTEM_PROMPTS = {
    "core": (
        f"{_COMMON}\nYour part is CORE: one short text block (at most {CORE_LIMIT_CHARS} characters) with the "
        "stable essentials about each person: identity, relationships, long-term goals, key preferences.\n"
        "Answer with exactly one of:\n"
        '{"operation": "APPEND", "content": "<new lines to add>"}\n'
        '{"operation": "REPLACE", "old_text": "<exact text now in core>", "new_text": "<replacement>"}\n'
        '{"operation": "REWRITE", "content": "<the whole new core block>"}\n'
        '{"operation": "NONE"}'
    ),
    "episodic": (
        f"{_COMMON}\nYour part is EPISODIC: dated events. Write each as "
        '"YYYY-MM-DD: title | Details: ..." using the session date to resolve relative dates '
        '("yesterday", "last week").'
    ),
    "semantic": (
        f"{_COMMON}\nYour part is SEMANTIC: lasting facts about people, things and places. Write each as "
        '"Entity - Aspect: summary | Details: ...".'
    ),
    "procedural": (
        f"{_COMMON}\nYour part is PROCEDURAL: how-tos, routines and methods someone described. Write each as "
        '"Title | Steps: 1. ... 2. ... | Context: ...".'
    ),
}
_PART_FORMAT = (
    "\nAnswer with {\"operations\": [...]} where each operation is one of:\n"
    '{"action": "ADD", "memory": "<text>"}\n'
    '{"action": "UPDATE", "id": "<id>", "memory": "<new text>"}\n'
    '{"action": "MERGE", "ids": ["<id>", "<id>"], "memory": "<merged text>"}  (keeps the first id)\n'
    '{"action": "DELETE", "id": "<id>"}\n'
    'Use only ids shown below. {"operations": []} means no change.'
)
for _p in PARTS:
    SYSTEM_PROMPTS[_p] += _PART_FORMAT


def select_relevant(entries: list[Entry], session_text: str, embedder=None,
                    k: int = MAX_SHOWN_ENTRIES) -> list[Entry]:
    """Up to ``k`` entries most similar to the session (cosine of embeddings), returned in id
    order. Without an embedder, the ``k`` most recently updated entries. Shape-free: lists."""
    if len(entries) <= k:
        return list(entries)
    if embedder is None:
        chosen = sorted(entries, key=lambda e: (e.updated, e.created))[-k:]
    else:
        vecs = embedder.encode([session_text] + [e.text for e in entries])
        sims = vecs[1:] @ vecs[0]
        top = np.argpartition(-sims, k - 1)[:k]
        chosen = [entries[i] for i in top]
    order = {e.id: i for i, e in enumerate(entries)}
    return sorted(chosen, key=lambda e: order[e.id])


@dataclass(frozen=True)
class ManagerPrompt:
    """Chat messages for one manager on one session, plus the ids it was shown."""

    manager: str
    session: int
    messages: list[dict]
    shown_ids: tuple[str, ...]
    core_lines: tuple[str, ...] | None = None  # core: the non-empty lines of the shown core block


def build_prompt(manager: str, bank: MemoryBank, session: Session, embedder=None) -> ManagerPrompt:
    """Chat messages for ``manager`` given the bank *before* ``session``; ValueError for an unknown manager."""
    if manager not in MANAGERS:
        raise ValueError(f"unknown manager {manager!r}; expected one of {MANAGERS}")
    transcript = session.transcript()
    lines = [f"Session {session.index} date: {session.date_text or 'unknown'}", "",
             "Current core block:", bank.core or "(empty)", ""]
    shown: tuple[str, ...] = ()
    if manager != "core":
        rel = select_relevant(bank.entries(manager), transcript, embedder)
        shown = tuple(e.id for e in rel)
        lines.append(f"Existing {manager} entries (most relevant {len(rel)} of {len(bank.parts[manager])}):")
        lines.extend(f"[{e.id}] {e.text}" for e in rel)
        if not rel:
            lines.append("(none)")
        lines.append("")
    lines += ["New session transcript:", transcript, "", f"Now output the JSON for the {manager} part."]
    messages = [{"role": "system", "content": SYSTEM_PROMPTS[manager]},
                {"role": "user", "content": "\n".join(lines)}]
    core_lines = core_block_lines(bank.core) if manager == "core" else None
    return ManagerPrompt(manager, session.index, messages, shown, core_lines)


def core_block_lines(core: str) -> tuple[str, ...]:
    """The distinct non-blank lines of a core block, in order (what a REPLACE may name)."""
    return tuple(dict.fromkeys(ln for ln in (core or "").splitlines() if ln.strip()))


COMPRESS_SYSTEM = (
    "Shorten the memory block below to at most {target} characters. Keep names, relationships, "
    "dates and preferences; drop repetition. Reply with the shortened block only."
)


def compress_messages(core: str, target: int) -> list[dict]:
    return [{"role": "system", "content": COMPRESS_SYSTEM.format(target=target)},
            {"role": "user", "content": core}]
