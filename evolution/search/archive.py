"""The evolution archive: every candidate with its lineage and scores per split, the base program,
one specialist per capability and the selection history (PrisMem Algorithm 1; docs/design.md § "Run
state"), and the integration log (:class:`IntegrationRecord`). Plain JSON (:meth:`Archive.to_json` /
:meth:`Archive.from_json`) without the scores, whose one copy is each candidate's ``eval.json``
(:func:`memgym.evolution.search.journal.load_scores` puts them back); restored exactly on ``--resume``.
"""
from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from typing import ClassVar

from memgym.evolution.execution.component_diff import component_hashes
from memgym.memory_bank.schema import CAPABILITY_NAMES

CAPABILITIES: tuple[str, ...] = tuple(CAPABILITY_NAMES)
"""PrisMem's five capability letters in table order ("F", "T", "P", "M", "A"), read from the one
F/T/P/M/A table :data:`memgym.memory_bank.schema.CAPABILITY_NAMES`."""


def program_key(source: str) -> str:
    """sha256 (16 hex digits) of a program's component hashes: two programs with equal keys
    differ at most in comments, docstrings and formatting. Raises SyntaxError."""
    h = component_hashes(source)
    return hashlib.sha256(json.dumps(h, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class SplitScores:
    """Scores of one program on one split, all in [0, 1]: ``overall`` (mean over tasks),
    ``by_capability`` (mean over each capability's primary tasks), ``tasks`` (task id → score),
    ``by_category`` (mean per native label), ``retrieved_chars`` (mean characters scored on,
    after the context budget; None when unknown) and ``failed`` (conversation id → why it failed;
    its tasks score 0)."""

    overall: float
    by_capability: dict[str, float]
    tasks: dict[str, float]
    by_category: dict[str, float] = field(default_factory=dict)
    retrieved_chars: float | None = None
    failed: dict[str, str] = field(default_factory=dict)

    def scores(self) -> dict:
        """The summary's SCORES form ``{"overall", "by_capability"}`` plus ``by_category``,
        ``retrieved_chars`` and ``failed`` when known."""
        out = {"overall": self.overall, "by_capability": dict(self.by_capability)}
        if self.by_category:
            out["by_category"] = dict(self.by_category)
        if self.retrieved_chars is not None:
            out["retrieved_chars"] = self.retrieved_chars
        if self.failed:
            out["failed"] = dict(self.failed)
        return out


@dataclass
class Candidate:
    """One proposed program. ``id``: ``seed`` or ``r<round>-<attempt>``; ``stage``: ``seed`` |
    ``cold`` | ``refine`` | ``integrate``; ``target``: capability letter (None in cold start);
    ``status``: ``evaluated`` | ``rejected`` (failed checks/validation, duplicate or no-op) |
    ``failed`` (no program); ``edits``: ``{"search", "replace"}`` dicts (or ``[{"whole_file":
    true}]``); ``key``: :func:`program_key`; ``roles``: what it became; ``changed``: components."""

    id: str
    parent: str | None
    round: int
    stage: str
    target: str | None
    proposer: str
    status: str = "pending"
    reason: str = ""
    key: str | None = None
    program: str | None = None
    edits: list = field(default_factory=list)
    description: str = ""
    validation: dict | None = None
    changed: list = field(default_factory=list)
    train: SplitScores | None = None
    valid: SplitScores | None = None
    roles: list = field(default_factory=list)

    def to_dict(self) -> dict:
        """Every field but the scores (their copy is ``eval.json``)."""
        return {k: v for k, v in asdict(self).items() if k not in ("train", "valid")}

    @property
    def verdict(self) -> str:
        """The validation verdict in one word: ``ok``, ``level N`` or ``-`` (not validated)."""
        if not self.validation:
            return "-"
        return "ok" if self.validation["ok"] else f"level {self.validation['level']}"


@dataclass
class IntegrationRecord:
    """One stage-III attempt (:mod:`memgym.evolution.search.integrate`), as the integrator reads it back.
    ``attempt``: ``merge`` | ``condition`` | ``coder`` | ``-`` (skipped); ``anchor``: the program merged
    onto; ``candidate``: the judged program (an earlier one when the merge equals it; ``-`` when
    none); ``accepted``: what the round decided (``integrated: ...``, ``no: <reason>``,
    ``skipped: ...``); ``integrated``: accepted; ``merged_from``: ``"<id> (<caps>)"`` of the
    specialists merged; ``paired``: capability → paired case; ``conflicts`` and ``components`` of
    the merge; ``contributor_caps``; ``excluded``: ``[id, element]`` left out; ``drops``:
    capability → valid drop against the anchor; ``blamed`` specialist, ``blamed_step`` and its
    ``left_out`` elements; ``stuck``: the anchor cannot be split; ``merged_side``: the failed merge
    a condition attempt conditions; ``condition``: that attempt's rule and reader."""

    round: int
    anchor: str
    attempt: str = "-"
    candidate: str = "-"
    accepted: str = ""
    integrated: bool = False
    merged_from: list = field(default_factory=list)
    paired: dict = field(default_factory=dict)
    conflicts: list = field(default_factory=list)
    components: dict = field(default_factory=dict)
    contributor_caps: str = ""
    excluded: list = field(default_factory=list)
    drops: dict = field(default_factory=dict)
    blamed: str | None = None
    blamed_step: str | None = None
    left_out: list = field(default_factory=list)
    stuck: bool = False
    merged_side: str | None = None
    condition: dict | None = None
    kind: ClassVar[str] = "integration"
    step: ClassVar[None] = None


@dataclass
class Archive:
    """Base, specialists, every candidate (``candidates``: id → :class:`Candidate`, creation
    order), and what the selection policies read: ``selections`` (n_c), ``case_usage`` (u),
    ``combo_usage`` (v), ``attempts`` (capability → ids of its not-accepted candidates), and
    ``integrations``: the integration log, one :class:`IntegrationRecord` per integration round."""

    candidates: dict[str, Candidate] = field(default_factory=dict)
    base: str | None = None
    specialists: dict[str, str] = field(default_factory=dict)
    selections: dict[str, int] = field(default_factory=dict)
    case_usage: dict[str, int] = field(default_factory=dict)
    combo_usage: dict[str, int] = field(default_factory=dict)
    attempts: dict[str, list] = field(default_factory=dict)
    integrations: list[IntegrationRecord] = field(default_factory=list)

    def get(self, cid: str) -> Candidate:
        """The candidate ``cid`` (KeyError naming it when absent)."""
        if cid not in self.candidates:
            raise KeyError(f"no candidate {cid!r} in the archive")
        return self.candidates[cid]

    def evaluated(self) -> list[Candidate]:
        """Every candidate scored on train and valid, in creation order."""
        return [c for c in self.candidates.values() if c.status == "evaluated"]

    def keys(self) -> set[str]:
        """Program keys of every archived program (evaluated or rejected after validation)."""
        return {c.key for c in self.candidates.values() if c.key}

    def specialist(self, cap: str) -> Candidate:
        """c's specialist (the base when none was set)."""
        return self.get(self.specialists.get(cap, self.base))

    def lineage(self, cid: str) -> list[Candidate]:
        """``cid`` and its ancestors, oldest first."""
        out, cur = [], cid
        while cur is not None:
            c = self.get(cur)
            out.append(c)
            cur = c.parent
        return out[::-1]

    def add(self, cand: Candidate) -> None:
        """Store a candidate (ValueError on a duplicate id)."""
        if cand.id in self.candidates:
            raise ValueError(f"candidate {cand.id!r} is already archived")
        self.candidates[cand.id] = cand

    def promote(self, cand: Candidate, capabilities) -> list[str]:
        """Make ``cand`` the specialist of every capability in ``capabilities`` whose valid
        score it beats strictly. Returns the capabilities it took (also added to ``roles``)."""
        took = []
        for cap in capabilities:
            if cap not in cand.valid.by_capability:
                continue
            cur = self.specialist(cap)
            if cand.valid.by_capability[cap] > cur.valid.by_capability.get(cap, 0.0):
                self.specialists[cap] = cand.id
                took.append(cap)
                cand.roles.append(f"specialist:{cap}")
        return took

    def to_json(self) -> dict:
        return {"candidates": [c.to_dict() for c in self.candidates.values()], "base": self.base,
                "specialists": dict(self.specialists), "selections": dict(self.selections),
                "case_usage": dict(self.case_usage), "combo_usage": dict(self.combo_usage),
                "attempts": {k: list(v) for k, v in self.attempts.items()},
                "integrations": [asdict(r) for r in self.integrations]}

    @classmethod
    def from_json(cls, d: dict) -> "Archive":
        """The archive of :meth:`to_json` (scores not yet loaded)."""
        return cls({c["id"]: Candidate(**c) for c in d["candidates"]}, d["base"], dict(d["specialists"]),
                   dict(d["selections"]), dict(d["case_usage"]), dict(d["combo_usage"]),
                   {k: list(v) for k, v in d["attempts"].items()},
                   [IntegrationRecord(**r) for r in d["integrations"]])

    def merges(self) -> list[IntegrationRecord]:
        """The accepted integration attempts, in round order."""
        return [r for r in self.integrations if r.integrated]

    def fingerprint(self) -> list:
        """What must agree between an uninterrupted and a resumed run: per candidate (id,
        status, program key, train/valid task scores), base and specialists."""
        rows = [[c.id, c.status, c.key, c.parent, c.train.tasks if c.train else None,
                 c.valid.tasks if c.valid else None] for c in self.candidates.values()]
        return [rows, self.base, dict(sorted(self.specialists.items()))]
