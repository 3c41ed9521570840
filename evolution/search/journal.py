"""The run journal: one typed record per finished step of a round (GEPA-style events), each with
one JSON form (``to_json`` / ``from_json``). The run dir's writer stores them as
``candidates/<id>/<step>.json``; ``--resume`` replays the interrupted round from them
(:func:`load_record`). Steps: ``proposal`` / ``revise`` (:class:`ProposalRecord`, with the RNG
state after it), ``validation`` / ``validation2``, ``eval`` (the one copy of a candidate's train and
valid scores, :func:`load_scores`), ``outcome`` (:class:`RoundRecord`: what the round decided); plus
the archive's :class:`~memgym.evolution.search.archive.IntegrationRecord` (no file of its own) and
:class:`FinalRecord` (``final.json``).
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import ClassVar

from memgym.evolution.search.archive import SplitScores
from memgym.evolution.search.proposers.base import ProposalResult
from memgym.evolution.search.rundir import read_json


def rng_to_json(state) -> list:
    """``random.Random.getstate()`` as JSON (a list)."""
    return [state[0], list(state[1]), state[2]]


def rng_from_json(v) -> tuple:
    """The inverse of :func:`rng_to_json`."""
    return (v[0], tuple(v[1]), v[2])


class FieldsRecord:
    """A record whose JSON form is its fields, in order (``to_json`` / ``from_json``)."""

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, d: dict):
        return cls(*(d[f.name] for f in fields(cls)))


@dataclass
class ProposalRecord:
    """A proposal (or, ``revise`` True, its one revise; ``result`` None = the proposer had no
    second try). ``rng``: the run RNG's state after it (:func:`rng_to_json`)."""

    candidate: str
    round: int
    result: ProposalResult | None
    rng: list
    case_ids: list = field(default_factory=list)
    cases: list = field(default_factory=list)
    revise: bool = False
    kind: ClassVar[str] = "proposal"

    @property
    def step(self) -> str:
        return "revise" if self.revise else "proposal"

    def to_json(self) -> dict:
        d = {"candidate": self.candidate, "round": self.round,
             "result": self.result.to_dict() if self.result is not None else None, "rng": self.rng}
        if not self.revise:
            d.update(case_ids=self.case_ids, cases=self.cases)
        return d

    @classmethod
    def from_json(cls, d: dict, revise: bool = False) -> "ProposalRecord":
        res = ProposalResult.from_dict(d["result"]) if d["result"] is not None else None
        return cls(d["candidate"], d["round"], res, d["rng"], d.get("case_ids", []), d.get("cases", []), revise)


@dataclass
class ValidationRecord:
    """The 4-level validation verdict of a candidate's program (``second``: after the revise)."""

    candidate: str
    round: int
    verdict: dict
    second: bool = False
    kind: ClassVar[str] = "validation"

    @property
    def step(self) -> str:
        return "validation2" if self.second else "validation"

    @property
    def ok(self) -> bool:
        return bool(self.verdict["ok"])

    def to_json(self) -> dict:
        return {"candidate": self.candidate, "round": self.round, **self.verdict}

    @classmethod
    def from_json(cls, d: dict, second: bool = False) -> "ValidationRecord":
        return cls(d["candidate"], d["round"], {k: v for k, v in d.items() if k not in ("candidate", "round")}, second)


@dataclass
class EvaluationRecord(FieldsRecord):
    """Train (with diagnostics) and valid evaluation of a candidate. ``diagnostics``: the
    proposer's table (:func:`memgym.evolution.search.evaluator.diag_table`); ``usage``: ``{role:
    {"calls", "prompt", "completion"}}``; ``stage_items``: ``{split: {stage: {"run",
    "cached"}}}``; ``reuse``: the valid run's reuse counts."""

    candidate: str
    round: int
    train: SplitScores
    valid: SplitScores
    diagnostics: dict
    usage: dict
    stage_items: dict
    reuse: dict | None = None
    kind: ClassVar[str] = "evaluation"
    step: ClassVar[str] = "eval"

    def to_json(self) -> dict:
        return {**super().to_json(), "train": self.train.__dict__, "valid": self.valid.__dict__}

    @classmethod
    def from_json(cls, d: dict) -> "EvaluationRecord":
        return cls(d["candidate"], d["round"], SplitScores(**d["train"]), SplitScores(**d["valid"]),
                   d["diagnostics"], d["usage"], d["stage_items"], d.get("reuse"))


@dataclass
class RoundRecord(FieldsRecord):
    """What round ``round`` decided (the seed's is round 0): ``stage`` (seed | cold | refine |
    integrate | holistic), ``target`` (letter or None), ``parent`` (None for the seed; after a
    parent fallback, ``fallback_from`` is the one first chosen), ``candidate`` (``-`` for an
    integration round that judged none), its ``proposal`` (one line), ``accepted`` (what it
    became, ``no: <reason>`` or ``skipped: ...``), the ``base`` and ``specialists`` (letter → id)
    after it (None for an integration round that made no candidate). The candidate's status,
    verdict and scores are the archive's; report.md renders one row per record. Stored in
    ``state.json`` and, for a candidate made in the round, as its ``outcome.json``."""

    round: int
    stage: str
    target: str | None
    parent: str | None
    candidate: str
    proposal: str
    accepted: str
    base: str | None = None
    specialists: dict | None = None
    fallback_from: str | None = None
    kind: ClassVar[str] = "outcome"
    step: ClassVar[str] = "outcome"


_STEPS = {"proposal": lambda d: ProposalRecord.from_json(d), "revise": lambda d: ProposalRecord.from_json(d, True),
          "validation": lambda d: ValidationRecord.from_json(d),
          "validation2": lambda d: ValidationRecord.from_json(d, True),
          "eval": EvaluationRecord.from_json, "outcome": RoundRecord.from_json}


def record_path(root: str | Path, cid: str, step: str) -> Path:
    """``root/candidates/<cid>/<step>.json``."""
    return Path(root) / "candidates" / cid / f"{step}.json"


def load_scores(root: str | Path, archive) -> dict:
    """Put the train and valid scores of every evaluated candidate of ``archive`` back from its
    ``eval.json`` (their one copy); returns ``{id: diagnostics}``. A missing or damaged record is
    a :class:`~memgym.evolution.search.rundir.RunStateError` naming it."""
    from memgym.evolution.search.rundir import RunStateError

    diagnostics = {}
    for c in archive.evaluated():
        ev = load_record(root, c.id, "eval")
        if ev is None:
            raise RunStateError(f"{record_path(root, c.id, 'eval')}: missing: the archive holds {c.id} as evaluated "
                                "and the run needs its scores")
        c.train, c.valid, diagnostics[c.id] = ev.train, ev.valid, ev.diagnostics
    return diagnostics


def load_archive(root: str | Path):
    """The archive of the run in ``root`` (its ``state.json``) with its scores (:func:`load_scores`)."""
    from memgym.evolution.search.archive import Archive

    arch = Archive.from_json(read_json(Path(root) / "state.json")["archive"])
    load_scores(root, arch)
    return arch


def load_record(root: str | Path, cid: str, step: str):
    """The stored record of ``step`` (``proposal`` | ``revise`` | ``validation`` |
    ``validation2`` | ``eval`` | ``outcome``) of candidate ``cid``, None when absent; a damaged
    file raises :class:`~memgym.evolution.search.rundir.RunStateError` naming it."""
    from memgym.evolution.search.rundir import RunStateError

    path = record_path(root, cid, step)
    d = read_json(path)
    if d is None:
        return None
    try:
        return _STEPS[step](d)
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RunStateError(f"{path}: damaged {step} record: {type(e).__name__}: {e}") from None


@dataclass
class FinalRecord:
    """The final step's runs (``final.json``): ``{"final": id, "seed_test", "final_test",
    "specialists_test", "baselines", "usage", "ledger_final", "final_test_usage"}`` (test SCORES with per-task
    scores, None without a test split)."""

    runs: dict
    kind: ClassVar[str] = "final"
    step: ClassVar[str] = "final"
    candidate: ClassVar[None] = None

    def to_json(self) -> dict:
        return self.runs

    @classmethod
    def from_json(cls, d: dict) -> "FinalRecord":
        return cls(d)


def final_path(root: str | Path) -> Path:
    """``root/final.json``."""
    return Path(root) / "final.json"


def load_final(root: str | Path) -> FinalRecord | None:
    """The stored :class:`FinalRecord`, None when absent."""
    d = read_json(final_path(root))
    return None if d is None else FinalRecord.from_json(d)
