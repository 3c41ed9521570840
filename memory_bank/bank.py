"""The four-part memory bank: core block plus episodic, semantic and procedural entries
(MemBuilder, arXiv 2601.05488 §3.1). Lengths in characters; ids ``E1..``, ``S1..``, ``P1..``
never reused; applying a manager output is atomic.
"""
from __future__ import annotations

import copy
import json
from dataclasses import dataclass, field
from typing import Callable

from memgym.memory_bank.actions import (
    ID_PREFIX,
    MANAGERS,
    PARTS,
    Add,
    CoreAppend,
    CoreReplace,
    CoreRewrite,
    Delete,
    Merge,
    Update,
    parse_output,
)
from memgym.memory_bank.errors import BankFormatError, ReplaceTextNotFoundError, UnknownIdError

CORE_LIMIT_CHARS = 5_000
CORE_TARGET_CHARS = 3_000

#: ``compressor(core_text, target_chars) -> str``: shortens the core block (a model call).
Compressor = Callable[[str, int], str]


@dataclass
class Entry:
    """One episodic/semantic/procedural memory. ``history`` holds ``(session, text)`` for every
    earlier text, oldest first; ``created``/``updated`` are session indices."""

    id: str
    text: str
    created: int
    updated: int
    history: list[tuple[int, str]] = field(default_factory=list)

    def to_json(self) -> dict:
        return {"id": self.id, "text": self.text, "created": self.created, "updated": self.updated,
                "history": [[s, t] for s, t in self.history]}


@dataclass
class ApplyResult:
    """What one applied output changed: ids added/updated/deleted, and whether the core
    block was compressed."""

    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    core_compressed: bool = False


class MemoryBank:
    """The bank of one conversation.

    ``core_limit``/``core_target`` (characters): when the core grows past ``core_limit`` it is
    compressed to at most ``core_target`` by ``compressor`` (if none is set the block is kept
    as it is).
    """

    def __init__(self, core_limit: int = CORE_LIMIT_CHARS, core_target: int = CORE_TARGET_CHARS,
                 compressor: Compressor | None = None):
        self.core = ""
        self.parts: dict[str, dict[str, Entry]] = {p: {} for p in PARTS}
        self.next_id: dict[str, int] = {p: 1 for p in PARTS}
        self.session = 0  # last session applied
        self.core_limit = core_limit
        self.core_target = core_target
        self.compressor = compressor

    # ---- reading -------------------------------------------------------------------------
    def entries(self, part: str) -> list[Entry]:
        """Live entries of ``part`` in id order."""
        return list(self.parts[part].values())

    def counts(self) -> dict[str, int]:
        return {p: len(self.parts[p]) for p in PARTS}

    def summary(self) -> dict:
        """``{"sessions", "core_chars", "episodic", "semantic", "procedural"}``."""
        return {"sessions": self.session, "core_chars": len(self.core), **self.counts()}

    # ---- applying ------------------------------------------------------------------------
    def apply_text(self, manager: str, text: str, session: int, finish_reason: str | None = None) -> ApplyResult:
        """Parse ``text`` as ``manager``'s output and apply it atomically.

        ``finish_reason``: the completion's, when known (``"length"`` = cut off: a
        ``truncated`` failure). Raises a :class:`~memgym.memory_bank.errors.ManagerOutputError`
        subclass; on error the bank is unchanged (byte-identical JSON)."""
        return self.apply(manager, parse_output(manager, text, finish_reason), session)

    def apply(self, manager: str, ops, session: int) -> ApplyResult:
        """Apply already-parsed operations (see :mod:`memgym.memory_bank.actions`) atomically."""
        if manager not in MANAGERS:
            raise ValueError(f"unknown manager {manager!r}; expected one of {MANAGERS}")
        if manager == "core":
            new_core = self._core_after(ops)
            result = ApplyResult()
            if len(new_core) > self.core_limit and self.compressor is not None:
                new_core = self._compress(new_core)
                result.core_compressed = True
            self.core = new_core
        else:
            part = copy.deepcopy(self.parts[manager])
            next_id = self.next_id[manager]
            result = ApplyResult()
            for i, op in enumerate(ops):
                next_id = self._apply_part_op(manager, part, next_id, op, session, i, result)
            self.parts[manager] = part
            self.next_id[manager] = next_id
        self.session = max(self.session, session)
        return result

    def _core_after(self, op) -> str:
        if isinstance(op, CoreAppend):
            return f"{self.core}\n{op.content}" if self.core else op.content
        if isinstance(op, CoreReplace):
            if op.old_text not in self.core:
                raise ReplaceTextNotFoundError(f"old_text {op.old_text[:60]!r} not found in core", manager="core")
            return self.core.replace(op.old_text, op.new_text, 1)
        if isinstance(op, CoreRewrite):
            return op.content
        return self.core  # NONE

    def _compress(self, text: str) -> str:
        out = self.compressor(text, self.core_target)
        if not isinstance(out, str) or not out.strip():
            return text[: self.core_target]  # a failed compression keeps the head, never nothing
        return out[: self.core_target]

    @staticmethod
    def _apply_part_op(name, part, next_id, op, session, i, result) -> int:
        def need(id_):
            if id_ not in part:
                raise UnknownIdError(f"id {id_} is not in {name}", manager=name, op_index=i)
            return part[id_]

        def rewrite(entry, text):
            if entry.text != text:
                entry.history.append((entry.updated, entry.text))
                entry.text = text
            entry.updated = session

        if isinstance(op, Add):
            id_ = f"{ID_PREFIX[name]}{next_id}"
            part[id_] = Entry(id_, op.memory, session, session)
            result.added.append(id_)
            return next_id + 1
        if isinstance(op, Update):
            rewrite(need(op.id), op.memory)
            result.updated.append(op.id)
        elif isinstance(op, Merge):
            if len(set(op.ids)) != len(op.ids):
                raise UnknownIdError(f"MERGE repeats an id: {op.ids}", manager=name, op_index=i)
            keep = need(op.ids[0])
            others = [need(x) for x in op.ids[1:]]
            for o in others:  # merged-away texts live on in the kept entry's history
                keep.history.append((o.updated, f"[{o.id}] {o.text}"))
                del part[o.id]
                result.deleted.append(o.id)
            rewrite(keep, op.memory)
            result.updated.append(keep.id)
        elif isinstance(op, Delete):
            need(op.id)
            del part[op.id]
            result.deleted.append(op.id)
        return next_id

    # ---- serialisation -------------------------------------------------------------------
    def to_json(self) -> dict:
        return {
            "session": self.session,
            "core": self.core,
            "next_id": dict(self.next_id),
            **{p: [e.to_json() for e in self.parts[p].values()] for p in PARTS},
        }

    def dumps(self) -> str:
        """Canonical JSON text (stable key order): equal banks give equal strings."""
        return json.dumps(self.to_json(), ensure_ascii=False, sort_keys=True)

    @classmethod
    def from_json(cls, data: dict, **kw) -> "MemoryBank":
        """Inverse of :meth:`to_json`. Raises :class:`BankFormatError` naming the field."""
        if not isinstance(data, dict):
            raise BankFormatError(f"bank JSON must be an object, got {type(data).__name__}")
        bank = cls(**kw)
        try:
            bank.session = int(data.get("session", 0))
            core = data.get("core", "")
            if not isinstance(core, str):
                raise BankFormatError("field 'core' must be a string")
            bank.core = core
            for p in PARTS:
                items = data.get(p, [])
                if not isinstance(items, list):
                    raise BankFormatError(f"field '{p}' must be a list")
                for j, e in enumerate(items):
                    try:
                        ent = Entry(str(e["id"]), str(e["text"]), int(e["created"]), int(e["updated"]),
                                    [(int(s), str(t)) for s, t in e.get("history", [])])
                    except (KeyError, TypeError, ValueError) as err:
                        raise BankFormatError(f"field '{p}[{j}]': {type(err).__name__}: {err}") from None
                    if not ent.id.startswith(ID_PREFIX[p]):
                        raise BankFormatError(f"field '{p}[{j}].id': {ent.id!r} is not a {p} id")
                    bank.parts[p][ent.id] = ent
                default_next = 1 + max((int(x[1:]) for x in bank.parts[p]), default=0)
                bank.next_id[p] = int(data.get("next_id", {}).get(p, default_next))
        except BankFormatError:
            raise
        except (TypeError, ValueError, AttributeError) as err:
            raise BankFormatError(f"malformed bank JSON: {err}") from None
        return bank

    @classmethod
    def loads(cls, text: str, **kw) -> "MemoryBank":
        try:
            data = json.loads(text)
        except ValueError as e:
            raise BankFormatError(f"bank file is not valid JSON: {e}") from None
        return cls.from_json(data, **kw)

    def copy(self) -> "MemoryBank":
        new = MemoryBank(self.core_limit, self.core_target, self.compressor)
        new.core, new.session = self.core, self.session
        new.parts = copy.deepcopy(self.parts)
        new.next_id = dict(self.next_id)
        return new
