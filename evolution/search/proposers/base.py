"""The proposer input and output (docs/design.md § "Capability-driven evolution", proposers): every
proposer sees the same :class:`ProposalInput` and answers with a :class:`ProposalResult`; the loop
owns checks, validation, evaluation and acceptance. A proposer never raises for bad model output
(``ok=False`` with the reason); only for its own misconfiguration (:class:`ProposerError`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memgym.evolution.search.edits import Edit
from memgym.llm.errors import MemgymError


class ProposerError(MemgymError, ValueError):
    """A proposer cannot go on for a reason of its own, not of the model's output: it is
    misconfigured, or (``replay``) the request does not match its recording. The run stops;
    the message names the round."""

    kind = "usage"


@dataclass
class LineageEntry:
    """An ancestor (or a failed attempt): ``id``, ``stage``, ``target``, ``description`` of its
    change, ``changed`` components, ``delta``: valid score change against its parent per
    capability and ``overall`` (None for a never-evaluated attempt), ``reason`` why it was
    not accepted ("" for an ancestor)."""

    id: str
    stage: str
    target: str | None
    description: str
    changed: list[str]
    delta: dict | None
    reason: str = ""

    def render(self) -> str:
        d = "" if self.delta is None else " (" + ", ".join(f"{k} {v:+.3f}" for k, v in self.delta.items()) + ")"
        why = f" -- not accepted: {self.reason}" if self.reason else ""
        return f"- {self.id} [{self.stage}{', target ' + self.target if self.target else ''}] " \
               f"{self.description or 'no description'}{d}{why}"


@dataclass
class ProposalInput:
    """Everything a proposer may look at.

    ``source``: the parent program's text; ``parent``: its id; ``stage``: ``cold`` | ``refine``
    | ``integrate``; ``target``: capability letter (None in cold start); ``diagnostics``: the
    parent's train diagnostics table ``{capability: {"score", "d_ext", "d_idx", "d_ret",
    "unit_chars", "retrieved_chars", "n"}}``; ``cases``: rendered compact cases (text);
    ``case_ids``: their task ids; ``ancestors``/``failed``: :class:`LineageEntry` lists;
    ``known_keys``: program keys already archived (a proposer may use them to avoid
    duplicates); ``interface``: the program contract text; ``extra``: stage-specific material
    (integration: the specialist's diff and paired traces).
    """

    source: str
    parent: str
    stage: str
    target: str | None
    diagnostics: dict
    cases: list[str]
    case_ids: list[str]
    ancestors: list[LineageEntry]
    failed: list[LineageEntry]
    known_keys: frozenset = frozenset()
    interface: str = ""
    extra: dict = field(default_factory=dict)


@dataclass
class ProposalResult:
    """A proposer's answer. ``ok``: a program was produced (``source``); otherwise ``reason``
    says why not. ``edits``: the blocks applied (empty for a whole file, then
    ``whole_file`` True). ``description``: one line about the change. ``transcript``: every
    prompt/response exchanged (``[{"role", "content"}]`` per turn), for the run directory.
    ``turns``: model calls made (0 for offline proposers); ``prompt_tokens`` /
    ``completion_tokens``: what they cost (cache hits cost 0); ``estimated``: turns whose counts
    are tokenizer estimates (the server's usage was missing or invalid). A model turn is two
    transcript entries: ``{"role": "request", "messages": [...]}`` (every message sent, system
    included) and ``{"role": "response", "content", "sha256" (of content), "prompt_tokens",
    "completion_tokens"[, "cached": true (counts 0) | "estimated": true]}``, or ``{"role": "error", "content": reason}`` when
    the call failed."""

    ok: bool
    source: str | None = None
    edits: list[Edit] = field(default_factory=list)
    whole_file: bool = False
    description: str = ""
    reason: str = ""
    transcript: list = field(default_factory=list)
    turns: int = 0
    prompt_tokens: int = 0
    completion_tokens: int = 0
    estimated: int = 0

    def to_dict(self) -> dict:
        return {"ok": self.ok, "edits": [e.to_dict() for e in self.edits], "whole_file": self.whole_file,
                "description": self.description, "reason": self.reason, "transcript": self.transcript,
                "turns": self.turns, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "estimated": self.estimated, "source": self.source}

    @classmethod
    def from_dict(cls, d: dict) -> "ProposalResult":
        return cls(d["ok"], d.get("source"), [Edit.from_dict(e) for e in d["edits"]], d["whole_file"],
                   d["description"], d["reason"], d["transcript"], d["turns"], d.get("prompt_tokens", 0),
                   d.get("completion_tokens", 0), d.get("estimated", 0))
