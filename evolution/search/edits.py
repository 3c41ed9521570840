"""SEARCH/REPLACE edits: parsing a proposer's answer and applying it strictly.

Source: docs/design.md § "Capability-driven evolution" (proposers): a SEARCH text must occur exactly
once (whitespace-normalised matching is a second try); a miss names the closest region::

    <<<<<<< SEARCH
    old lines (copied exactly from the program)
    =======
    new lines
    >>>>>>> REPLACE

A whole file may come instead, as one fenced ```python block that defines the contract names
(:func:`parse_response` tells the two apart). Application is all-or-nothing: a failing block
leaves the program untouched and raises :class:`EditError` naming the block (1-based) and why.
"""
from __future__ import annotations

import difflib
import re
from dataclasses import dataclass

SEARCH_MARK, DIVIDER, REPLACE_MARK = "<<<<<<< SEARCH", "=======", ">>>>>>> REPLACE"
_BLOCK = re.compile(r"^[ \t]*<{5,9} ?SEARCH[ \t]*\n(.*?)^[ \t]*={5,9}[ \t]*\n(.*?)^[ \t]*>{5,9} ?REPLACE[ \t]*$",
                    re.DOTALL | re.MULTILINE)
_FENCE = re.compile(r"```(?:python|py)?[ \t]*\n(.*?)```", re.DOTALL)


@dataclass(frozen=True)
class Edit:
    """One SEARCH/REPLACE block: ``search`` must occur exactly once in the program and is
    replaced by ``replace`` (both exact text, newlines included)."""

    search: str
    replace: str

    def to_dict(self) -> dict:
        return {"search": self.search, "replace": self.replace}

    @classmethod
    def from_dict(cls, d: dict) -> "Edit":
        return cls(d["search"], d["replace"])


class EditError(ValueError):
    """An edit could not be applied or parsed. ``block``: 1-based block number (0 = the whole
    answer); ``closest``: the program region most similar to the missing SEARCH text (with
    line numbers), for the repair turn."""

    def __init__(self, message: str, *, block: int = 0, closest: str = ""):
        super().__init__(message)
        self.block, self.closest = block, closest


@dataclass
class Proposal:
    """What a response carries: ``edits`` (SEARCH/REPLACE blocks) or ``whole_file`` (a full
    program), never both; ``kind`` is ``edits`` | ``file`` | ``none`` (nothing usable)."""

    kind: str
    edits: list[Edit]
    whole_file: str | None = None


def parse_response(text: str) -> Proposal:
    """Parse an LLM answer. SEARCH/REPLACE blocks win when any is present; otherwise a fenced
    python block that defines ``class Memory`` counts as a whole file. A response with
    ``<<<<<<< SEARCH`` but an unterminated block raises :class:`EditError` (so the repair turn
    can say so); prose without either gives ``kind="none"``."""
    if not isinstance(text, str):
        raise EditError(f"response must be text, got {type(text).__name__}")
    blocks = [Edit(m.group(1), m.group(2)) for m in _BLOCK.finditer(text)]
    opened = len(re.findall(r"^[ \t]*<{5,9} ?SEARCH", text, re.MULTILINE))
    if opened > len(blocks):
        raise EditError(f"{opened - len(blocks)} of {opened} SEARCH blocks are not closed by "
                        f"'{DIVIDER}' and '{REPLACE_MARK}' lines", block=len(blocks) + 1)
    if blocks:
        return Proposal("edits", blocks)
    files = [m.group(1) for m in _FENCE.finditer(text) if re.search(r"^class Memory\b", m.group(1), re.MULTILINE)]
    if files:
        return Proposal("file", [], max(files, key=len))
    return Proposal("none", [])


def _norm_lines(text: str) -> list[str]:
    return [" ".join(line.split()) for line in text.strip("\n").splitlines()]


def _find_normalised(source: str, search: str) -> list[tuple[int, int]]:
    """Character spans of ``source`` whose lines equal ``search``'s lines after collapsing
    whitespace (runs of blanks → one space, ends stripped)."""
    want = _norm_lines(search)
    if not want or not any(want):
        return []
    lines = source.splitlines(keepends=True)
    norm = [" ".join(x.split()) for x in lines]
    starts = [0]
    for x in lines:
        starts.append(starts[-1] + len(x))
    out = []
    for i in range(len(lines) - len(want) + 1):
        if norm[i: i + len(want)] == want:
            out.append((starts[i], starts[i + len(want)]))
    return out


def closest_region(source: str, search: str, context: int = 2) -> str:
    """The lines of ``source`` most similar to ``search`` (difflib ratio over windows of the
    same line count), with ``context`` lines around, numbered ``NNN| line``."""
    lines = source.splitlines()
    n = max(1, len(search.strip("\n").splitlines()))
    if not lines:
        return ""
    target = "\n".join(_norm_lines(search))
    best, best_i = -1.0, 0
    for i in range(0, max(1, len(lines) - n + 1)):
        window = "\n".join(" ".join(x.split()) for x in lines[i: i + n])
        r = difflib.SequenceMatcher(None, target, window, autojunk=False).ratio()
        if r > best:
            best, best_i = r, i
    lo, hi = max(0, best_i - context), min(len(lines), best_i + n + context)
    return "\n".join(f"{k + 1:4d}| {lines[k]}" for k in range(lo, hi))


def apply_edits(source: str, edits: list[Edit]) -> str:
    """Apply ``edits`` in order to ``source`` and return the new text.

    Each SEARCH must occur exactly once in the text produced by the previous blocks: first as
    an exact substring, then (second try) line-wise with whitespace normalised, in which case
    the matched lines are replaced by REPLACE as given. Raises :class:`EditError` (nothing
    applied) for an empty SEARCH, a SEARCH found 0 times (with :func:`closest_region`) or
    more than once, and for edits that change nothing at all.
    """
    if not edits:
        raise EditError("no edits to apply")
    text = source
    for k, e in enumerate(edits, 1):
        if not e.search.strip():
            raise EditError(f"block {k}: SEARCH is empty", block=k)
        count = text.count(e.search)
        if count == 1:
            text = text.replace(e.search, e.replace, 1)
            continue
        if count > 1:
            raise EditError(f"block {k}: SEARCH text occurs {count} times; include more lines to make it unique",
                            block=k)
        spans = _find_normalised(text, e.search)
        if len(spans) == 1:
            a, b = spans[0]
            rep = e.replace if e.replace.endswith("\n") or not e.replace else e.replace + "\n"
            text = text[:a] + rep + text[b:]
            continue
        if len(spans) > 1:
            raise EditError(f"block {k}: SEARCH text occurs {len(spans)} times (ignoring whitespace); include more "
                            f"lines to make it unique", block=k)
        region = closest_region(text, e.search)
        raise EditError(f"block {k}: SEARCH text not found in the program; the closest region is:\n{region}",
                        block=k, closest=region)
    if text == source:
        raise EditError("the edits change nothing (every REPLACE equals its SEARCH)")
    return text


def render_edits(edits: list[Edit]) -> str:
    """The blocks as text, in the format :func:`parse_response` reads."""
    return "\n".join(f"{SEARCH_MARK}\n{e.search}{'' if e.search.endswith(chr(10)) else chr(10)}{DIVIDER}\n"
                     f"{e.replace}{'' if e.replace.endswith(chr(10)) or not e.replace else chr(10)}{REPLACE_MARK}"
                     for e in edits)
