"""Typed results of the execution layer: :class:`ConversationTrace`, :class:`ProgramRun` and
:class:`ProgramEvaluation`; one question's result is the
:class:`memgym.rewards.scoring.summary.QuestionResult` every evaluation shares. Scores in [0, 1];
lengths in characters.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field, fields
from pathlib import Path

from memgym.evolution.execution.component_diff import STAGES, ComponentDiff
from memgym.llm.errors import MemgymError
from memgym.memory_bank.contract import ProgramInfo
from memgym.memory_bank.schema import Conversation
from memgym.rewards.scoring.summary import QuestionResult


@dataclass
class ConversationTrace:
    """Per conversation: ``units[i]`` = the unit dicts extracted from session i (0-based, in
    session order) with ``session_index[i]`` its 1-based index; ``probes`` maps an evidence
    turn id to what retrieve returned for that turn's text as the query (d_idx)."""

    conversation: Conversation
    units: list[list[dict]]
    session_index: list[int]
    probes: dict[str, str] = field(default_factory=dict)
    extract_failures: int = 0


@dataclass
class ProgramRun:
    """Everything one :meth:`ProgramRunner.run` produced (see the module docstring); ``failed``:
    conversation id → why it failed (a run that keeps going past failed conversations)."""

    info: ProgramInfo
    hashes: dict[str, str]
    diff: ComponentDiff | None
    tasks: list[QuestionResult]
    traces: list[ConversationTrace]
    stage_items: dict[str, dict[str, int]]
    stage_llm_calls: dict[str, int]
    answer_skipped: bool
    plan_failures: int
    retrieve_errors: int
    extraction: dict
    wall_s: float
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def stages_run(self) -> list[str]:
        """Stages that executed at least one item, in stage order."""
        return [s for s in STAGES if self.stage_items[s]["run"] > 0]

    @property
    def stages_reused(self) -> list[str]:
        """Stages that took at least one item from the cache, in stage order."""
        return [s for s in STAGES if self.stage_items[s]["reused"] > 0]


def dump_units(run: ProgramRun, path: Path) -> None:
    """Write every conversation's extracted units as JSONL (one line per session:
    ``{"conversation", "session", "units"}``) for inspection."""
    with open(path, "w", encoding="utf-8") as fh:
        for tr in run.traces:
            for idx, units in zip(tr.session_index, tr.units):
                fh.write(json.dumps({"conversation": tr.conversation.id, "session": idx, "units": units},
                                    ensure_ascii=False) + "\n")


@dataclass
class ProgramEvaluation:
    """The scored report of one program evaluation. ``ok`` False: validation failed
    (``validation`` holds the verdict) and nothing was measured. ``summary`` is
    :func:`memgym.rewards.scoring.summary.summarise` of ``questions`` (one
    :class:`~memgym.rewards.scoring.summary.QuestionResult` each), the one score form: ``n``,
    ``overall``, ``by_capability`` and ``by_category`` read it; ``tasks`` are the questions' JSON
    rows (``tasks.jsonl``, what evolve's search reads). ``diagnostics`` without per-task rows; call
    and token counts per role; ``wall_s`` in seconds; ``failed_conversations``: conversation id →
    why it failed (its questions are scored 0 with that error), when the run kept going past it.
    """

    ok: bool = True
    summary: dict = field(default_factory=dict)
    questions: list[QuestionResult] = field(default_factory=list)
    diagnostics: dict | None = None
    stages_run: list = field(default_factory=list)
    stages_reused: list = field(default_factory=list)
    stages_skipped: list = field(default_factory=list)
    stage_items: dict = field(default_factory=dict)
    stage_llm_calls: dict = field(default_factory=dict)
    reuse: dict | None = None
    component_hashes: dict = field(default_factory=dict)
    extraction: dict = field(default_factory=dict)
    plan_failures: int = 0
    retrieve_errors: int = 0
    empty_answers: int = 0
    judge_unparsable: int = 0
    judge_note: str | None = None
    judge_protocol: str = "official"
    failed_conversations: dict = field(default_factory=dict)
    judge_calls: dict | None = None
    model_calls: dict = field(default_factory=dict)
    tokens: dict = field(default_factory=dict)
    wall_s: float = 0.0
    validation: dict | None = None
    program: str | None = None
    program_sha256: str | None = None
    parent: str | None = None
    config: dict | None = None

    n = property(lambda self: self.summary.get("n", 0))
    overall = property(lambda self: self.summary.get("overall", 0.0))
    by_capability = property(lambda self: self.summary.get("by_capability", {}))
    by_category = property(lambda self: self.summary.get("by_category", {}))

    @property
    def tasks(self) -> list[dict]:
        """One JSON row per question (:meth:`QuestionResult.to_dict`, view ``task``), in run order."""
        return [q.to_dict("task") for q in self.questions]

    def scores(self) -> dict:
        """``{"overall": float, "by_capability": {letter: float}}`` (the evolve summary's SCORES)."""
        return {"overall": self.overall, "by_capability": {k: v["score"] for k, v in self.by_capability.items()}}

    def task_scores(self) -> dict[str, float]:
        """``{"<conversation>/<question id>": score}`` over every question, in run order."""
        return {q.key: q.score for q in self.questions}

    def to_dict(self, tasks: bool = True) -> dict:
        """``report.json``: ``ok``, the headline scores, every other field in order, ``summary``
        without the two tables (with ``judge_note``; None when nothing was measured), ``tasks``
        (left out when False)."""
        out = {"ok": self.ok, "n": self.n, "overall": self.overall, "by_capability": self.by_capability,
               "by_category": self.by_category}
        for f in fields(self)[3:]:
            if f.name == "judge_protocol":
                summ = {k: v for k, v in self.summary.items() if k not in ("by_capability", "by_category")}
                out["summary"] = (summ | ({"judge_note": self.judge_note} if self.judge_note else {})) or None
            if f.name == "validation" and tasks:
                out["tasks"] = self.tasks
            if f.name != "judge_note":
                out[f.name] = getattr(self, f.name)
        return out


class ProgramRunError(MemgymError, RuntimeError):
    """A program could not be evaluated: a broken contract, a dead/timed-out sandbox, or an
    extraction that cannot be mapped to the program's units. ``stage`` names the stage,
    ``conversation`` the conversation (or "")."""

    def __init__(self, message: str, *, stage: str, conversation: str = ""):
        where = f"{stage}" + (f" [{conversation}]" if conversation else "")
        super().__init__(f"{where}: {message}")
        self.stage, self.conversation, self.reason = stage, conversation, message
