"""The evolution loop (PrisMem Algorithm 1; DESIGN.md § "Capability-driven evolution").

:class:`Evolution` runs, round by round: **cold start** (``rounds_cold``: the proposer sees the
diagnostics table and compact cases spread over capabilities; a child becomes the new base
when the valid overall score improves), **capability refinement** (``rounds_refine``: target
by the target policy, parent by the parent policy, cases by the case policy; a child becomes
the specialist of every capability whose valid score it beats), then **integration**
(``rounds_integrate``, a hook: the ``integrator`` object, by default
:class:`evolution.search.integrate.TraceGuidedIntegrator`) and the
**final** step: the frozen program (:meth:`Evolution.final_program`: the best valid overall
among the base, every specialist and every accepted merge, ties to the later one) runs once on
the test split, beside the seed and every specialist.

Plug-in points (all small objects, swapped for ablations): ``target_policy``,
``parent_policy``, ``case_policy``, ``acceptance`` (:mod:`evolution.search.select`),
``proposer`` (:mod:`evolution.search.proposers`), ``integrator`` (an object with
``run_round(evo, round_no, rng)`` and ``final(evo) -> candidate id``; ``rounds_integrate``
rounds go to it, after refinement). A round is one proposal → checks → validation (one revise
turn on failure) → evaluation on train and valid → acceptance → :meth:`Evolution.record_round`;
:meth:`Evolution.build_input` and :meth:`Evolution.attempt` do the first steps for any stage,
so an integrator reuses them (it passes its extra material in ``ProposalInput.extra``), then
applies its own acceptance rule and calls ``record_round``. Integrator state that must
survive ``--resume`` goes into the archive or into step files under ``candidates/<id>/``.

Run state: after every round ``state.json`` (archive, RNG state, ledger, history) is written
atomically; inside a round every finished step (proposal, validation, evaluation) is a file
under ``candidates/<id>/``. ``resume`` restarts the interrupted round from its start state and
replays the finished steps from their files (the RNG state after a proposal is stored with
it), so the resumed run ends exactly where an uninterrupted one ends and nothing is proposed,
validated or evaluated twice (re-running an evaluation killed half-way reuses the stage
cache). Fault injection for tests: ``MEMGYM_EVOLVE_FAULT=<point>:<round>`` (point
``proposal`` | ``evaluation`` | ``round_end``) kills the process with SIGKILL there.
"""
from __future__ import annotations

import os
import random
import signal
import time
from pathlib import Path

from tqdm.auto import tqdm

from evolution.execution.program_eval import evaluate_program
from evolution.execution.runner import ProgramRunError, ProgramRunner
from evolution.execution.sandbox import SandboxLimits
from evolution.execution.stages import StageCache
from evolution.execution.validate import ValidationLimits, validate_program
from evolution.search.archive import CAPABILITIES, Archive, Candidate, SplitScores, program_key
from evolution.search.cases import case_from_run, render_compact
from evolution.search.config import EvolveConfig
from evolution.search.ledger import BudgetExhausted, Ledger, usage_from_eval
from evolution.search.proposers.base import LineageEntry, ProposalInput, ProposalResult
from evolution.search.rundir import (RunDir, RunStateError, atomic_write_json, atomic_write_text, check_recipe,
                                     check_state, read_json, recipe_fields, run_lock)
from evolution.search.stops import check_endpoint
from evolution.search.select import (CapabilityAcceptance, DependencyAwareTarget, HistoryGuidedCases,
                                     SpecialistParent, TaskInfo, freeze_choice, record_cases)
from memory_bank.program import unit_text

FAULT_ENV = "MEMGYM_EVOLVE_FAULT"


def _fault(point: str, round_no) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec and spec == f"{point}:{round_no}":
        os.kill(os.getpid(), signal.SIGKILL)


def _rng_to_json(state) -> list:
    return [state[0], list(state[1]), state[2]]


def _rng_from_json(v) -> tuple:
    return (v[0], tuple(v[1]), v[2])


def precheck(source: str, parent: Candidate, archive: Archive) -> str:
    """Why a child is rejected before validation, or "": unparsable source, a no-op (same
    :func:`program_key` as its parent: only comments, docstrings or formatting changed) or a
    duplicate of any archived program (named)."""
    try:
        key = program_key(source)
    except SyntaxError as e:
        return f"syntax error at line {e.lineno}: {e.msg}"
    if key == parent.key:
        return "no-op: the child equals its parent (up to comments and formatting)"
    dup = next((c.id for c in archive.candidates.values() if c.key == key), None)
    return f"duplicate of archived program {dup}" if dup else ""


class Evolution:
    """One evolution run in ``cfg.out`` (see the module doc).

    ``rt``: a :class:`llm.runtime.Runtime` (default: built from the recipe, response cache
    in the run dir); ``proposer``: default from ``cfg.proposer``
    (:func:`evolution.search.proposers.make_proposer`); ``integrator``: default the
    trace-guided integrator when ``cfg.rounds_integrate`` > 0. Ablations build their policies
    with :func:`evolution.search.ablations.build_evolution`.
    """

    def __init__(self, cfg: EvolveConfig, *, rt=None, proposer=None, target_policy=None, parent_policy=None,
                 case_policy=None, acceptance=None, integrator=None):
        from evolution.search.proposers import make_proposer

        self.cfg = cfg
        self.dir = RunDir(cfg.out)
        self.dir.root.mkdir(parents=True, exist_ok=True)
        if rt is None:
            from llm.runtime import Runtime
            cache = cfg.cache or str(self.dir.root / "responses.sqlite")
            rt = Runtime.from_config(cache=cache, batch_size=cfg.batch_size, request_timeout_s=cfg.request_timeout_s,
                                     request_retries=cfg.request_retries)
            if cfg.embedder.startswith("hash:"):
                from llm.embeddings import HashEmbedder
                rt = Runtime(cache=rt.cache, embedder=HashEmbedder(int(cfg.embedder[5:])), batch_size=cfg.batch_size,
                             request_timeout_s=cfg.request_timeout_s, request_retries=cfg.request_retries)
        self.rt = rt
        self.target_policy = target_policy or DependencyAwareTarget()
        self.parent_policy = parent_policy or SpecialistParent()
        self.case_policy = case_policy or HistoryGuidedCases()
        self.acceptance = acceptance or CapabilityAcceptance()
        if integrator is None and cfg.rounds_integrate:
            from evolution.search.integrate import TraceGuidedIntegrator
            integrator = TraceGuidedIntegrator(cfg.delta, random_cases=cfg.ablation == "random_cases",
                                               offline_first=cfg.integrate_offline_first, onto=cfg.integrate_onto)
        self.integrator = integrator
        self.proposer = proposer or make_proposer(cfg, rt)
        self.cache = StageCache(cfg.stage_cache or self.dir.root / "stages.sqlite")
        self.runner_diag = ProgramRunner(rt, cfg.runner_settings(diagnostics=True), self.cache)
        self.runner = ProgramRunner(rt, cfg.runner_settings(diagnostics=False), self.cache)
        self.limits = ValidationLimits(
            sandbox=SandboxLimits(call_timeout_s=cfg.validate_timeout_s, load_timeout_s=max(10.0, cfg.validate_timeout_s)),
            probe_units=cfg.probe_units, probe_batches=cfg.probe_batches)
        self.splits = self._load_splits()
        self.tasks = {t.id: t for ts in self._task_infos().values() for t in ts}
        self.archive = Archive()
        self.ledger = Ledger(budgets=cfg.budgets())
        self.history: list[dict] = []
        self.rng = random.Random(cfg.seed)
        self.next_round = 1
        self.elapsed_s = 0.0
        self.stopped: str | None = None
        self._t0 = time.time()

    # ------------------------------------------------------------------ data

    def _load_splits(self) -> dict:
        from data_synth.datasets import load_conversations

        out = {}
        for split in ("train", "valid", "test"):
            ids = getattr(self.cfg, split)
            if not ids:
                out[split] = []
                continue
            convs = load_conversations(self.cfg.dataset, self.cfg.data_path(split), ids=list(ids),
                                       n_sessions=self.cfg.n_sessions, max_questions=self.cfg.max_questions,
                                       beam_truncated=not self.cfg.beam_full_chat,
                                       beam_strip_markers=not self.cfg.beam_keep_markers)
            if self.cfg.labels != "native" and split != "test":
                from data_synth.annotate import apply_labels, load_labels
                convs = apply_labels(convs, load_labels(self.cfg.labels))
            out[split] = convs
        return out

    def _task_infos(self) -> dict[str, list[TaskInfo]]:
        return {split: [TaskInfo(f"{c.id}/{q.id}", split, q.capability.value if q.capability else None,
                                 tuple(x.value for x in q.secondary)) for c in convs for q in c.questions]
                for split, convs in self.splits.items()}

    def split_tasks(self, split: str) -> list[TaskInfo]:
        return [t for t in self.tasks.values() if t.split == split]

    # ------------------------------------------------------------------ state

    def save(self) -> None:
        """Write ``state.json`` atomically."""
        now = time.time()
        self.elapsed_s += now - self._t0
        self._t0 = now
        atomic_write_json(self.dir.state, {
            "archive": self.archive.to_json(), "ledger": self.ledger.to_json(), "history": self.history,
            "rng": _rng_to_json(self.rng.getstate()), "next_round": self.next_round, "elapsed_s": self.elapsed_s,
            "stopped": self.stopped, "recipe": recipe_fields(self.cfg)})

    def load(self) -> bool:
        """Restore ``state.json`` if present (True when restored)."""
        st = read_json(self.dir.state)
        if st is None:
            return False
        check_state(st, self.dir.state)
        check_recipe(st.get("recipe"), self.cfg, self.dir.recipe, self.dir.state)
        try:
            self.archive = Archive.from_json(st["archive"])
            self.ledger = Ledger.from_json(st["ledger"])
            self.rng.setstate(_rng_from_json(st["rng"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RunStateError(f"{self.dir.state}: damaged run state: {type(e).__name__}: {e}") from None
        self.ledger.budgets = self.cfg.budgets()
        self.history = st["history"]
        self.next_round = st["next_round"]
        self.elapsed_s = st["elapsed_s"]
        self.stopped = st.get("stopped")
        self._t0 = time.time()
        return True

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, source: str, split: str, *, parent_source: str | None = None, diagnostics: bool = False):
        """(:class:`ProgramEvaluation`, ProgramRun) of ``source`` on ``split``."""
        runner = self.runner_diag if diagnostics else self.runner
        return evaluate_program(source, self.splits[split], runner, parent_source=parent_source,
                                diagnostics=diagnostics)

    def _scores(self, ev) -> SplitScores:
        ret = [t.get("retrieved_chars") for t in ev.tasks if t.get("retrieved_chars") is not None]
        return SplitScores(ev.overall, {k: v["score"] for k, v in ev.by_capability.items() if k != "?"},
                           ev.task_scores(), {str(k): v["score"] for k, v in ev.by_category.items()},
                           round(sum(ret) / len(ret), 1) if ret else None)

    @staticmethod
    def diag_table(ev) -> dict:
        """The diagnostics table a proposer sees: per capability and ``overall``: n, score,
        d_ext, d_idx, d_ret, mean unit and retrieved characters; ``overall`` also says whether
        answers were generated (``answered``: False when the scorer reads the retrieved text)."""
        d = ev.diagnostics or {}
        dcap = d.get("by_capability", {})
        ret = {}
        for t in ev.tasks:
            ret.setdefault(t["capability"] or "?", []).append(t["retrieved_chars"])
        table = {}
        for cap, v in ev.by_capability.items():
            dc = dcap.get(cap, {})
            table[cap] = {"n": v["n"], "score": v["score"], "d_ext": dc.get("d_ext"), "d_idx": dc.get("d_idx"),
                          "d_ret": dc.get("d_ret"), "unit_chars": d.get("mean_unit_chars"),
                          "retrieved_chars": sum(ret.get(cap, [0])) / max(1, len(ret.get(cap, [])))}
        o = d.get("overall", {})
        table["overall"] = {"n": ev.n, "score": ev.overall, "d_ext": o.get("d_ext"), "d_idx": o.get("d_idx"),
                            "d_ret": o.get("d_ret"), "unit_chars": d.get("mean_unit_chars"),
                            "retrieved_chars": d.get("mean_retrieved_chars"),
                            "answered": "answer" not in ev.stages_skipped}
        return table

    def _evaluate_candidate(self, cand: Candidate, source: str, parent_source: str | None, round_no) -> dict:
        """Train (with diagnostics) then valid; stored as ``eval.json`` (replayed on resume)."""
        saved = self.dir.load_step(cand.id, "eval")
        if saved is not None:
            return saved
        usage = {}
        ev_tr, _ = self.evaluate(source, "train", parent_source=parent_source, diagnostics=True)
        _fault("evaluation", round_no)
        ev_va, _ = self.evaluate(source, "valid", parent_source=parent_source)
        for ev in (ev_tr, ev_va):
            for role, u in usage_from_eval(ev).items():
                row = usage.setdefault(role, {"calls": 0, "prompt": 0, "completion": 0})
                for k in row:
                    row[k] += u.get(k, 0)
        out = {"train": self._scores(ev_tr).__dict__, "valid": self._scores(ev_va).__dict__,
               "diagnostics": self.diag_table(ev_tr), "usage": usage,
               "stage_items": {"train": ev_tr.stage_items, "valid": ev_va.stage_items},
               "reuse": ev_va.reuse}
        self.dir.save_step(cand.id, "eval", out)
        return out

    # ------------------------------------------------------------------ seed

    def start(self) -> None:
        """Archive and evaluate the seed program (once)."""
        from memory_bank.programs import read_program_source, seed_program_path

        src_path = Path(self.cfg.seed_program) if self.cfg.seed_program else seed_program_path()
        source = read_program_source(src_path)
        atomic_write_text(self.dir.root / "seed.py", source)
        res = validate_program(source, None, self.limits)
        if not res.ok:
            raise ValueError(f"the seed program fails validation level {res.level}: {res.reason}")
        cand = Candidate("seed", None, 0, "seed", None, "seed", key=program_key(source),
                         program="candidates/seed/program.py", description="seed program",
                         validation=res.to_dict())
        atomic_write_text(self.dir.cand("seed") / "program.py", source)
        ev = self._evaluate_candidate(cand, source, None, 0)
        cand.train, cand.valid = SplitScores(**ev["train"]), SplitScores(**ev["valid"])
        cand.status, cand.roles = "evaluated", ["base"] + [f"specialist:{c}" for c in CAPABILITIES]
        self.ledger.add_usage(0, ev["usage"])
        self.archive.add(cand)
        self.archive.base = "seed"
        self.archive.specialists = {c: "seed" for c in CAPABILITIES if c in cand.valid.by_capability}
        self.history.append({"round": 0, "stage": "seed", "target": None, "parent": None, "candidate": "seed",
                             "proposal": "seed program", "verdict": "ok", "status": "evaluated",
                             "accepted": "base + all specialists", "valid": cand.valid.scores(),
                             "tokens": self.ledger.round_tokens(0)})

    def source_of(self, cid: str) -> str:
        return (self.dir.root / self.archive.get(cid).program).read_text(encoding="utf-8")

    # ------------------------------------------------------------------ one round

    def stage_of(self, round_no: int) -> str:
        c, r = self.cfg.rounds_cold, self.cfg.rounds_refine
        return "cold" if round_no <= c else "refine" if round_no <= c + r else "integrate"

    def lineage(self, parent: Candidate, target: str | None, stage: str = "cold") -> tuple[list, list]:
        """(ancestors, the last 5 failed attempts for ``target``, or for ``stage`` without a
        target) as :class:`LineageEntry` lists."""
        def entry(c: Candidate, reason: str = "") -> LineageEntry:
            delta = None
            if c.valid is not None and c.parent is not None:
                p = self.archive.get(c.parent).valid
                delta = {"overall": c.valid.overall - p.overall,
                         **{k: v - p.by_capability.get(k, 0.0) for k, v in c.valid.by_capability.items()}}
            return LineageEntry(c.id, c.stage, c.target, c.description, list(c.changed), delta, reason)

        ancestors = [entry(c) for c in self.archive.lineage(parent.id)]
        failed = [entry(self.archive.get(i), self.archive.get(i).reason or "not accepted")
                  for i in self.archive.attempts.get(target or stage, [])[-5:]]
        return ancestors, failed

    def build_input(self, round_no: int, stage: str, parent: Candidate, target: str | None,
                    case_ids: list[str]) -> ProposalInput:
        """The proposer's input: parent source, diagnostics, compact cases (rendered only for
        proposers whose ``needs_cases`` is not False; the ids are always kept), lineage."""
        parent_source = self.source_of(parent.id)
        diag = self.dir.load_step(parent.id, "eval")["diagnostics"]
        cases = []
        if case_ids and getattr(self.proposer, "needs_cases", True):
            ev, run = self.evaluate(parent_source, "train", diagnostics=False)  # all stages cached
            traces = {tr.conversation.id: tr for tr in run.traces}
            by_id = {f"{t.conversation}/{t.qa.id}": t for t in run.tasks}
            with self.runner.model_lock:
                for cid in case_ids:
                    task = by_id[cid]
                    mat = case_from_run(task, traces[task.conversation], lambda u: unit_text(u, run.info.unit_fields))
                    cases.append(render_compact(mat, self.rt.embedder, self.cfg.case_budget)[0])
        ancestors, failed = self.lineage(parent, target, stage)
        return ProposalInput(parent_source, parent.id, stage, target, diag, cases, case_ids, ancestors, failed,
                             frozenset(self.archive.keys()), extra={"round": round_no})

    def attempt(self, round_no: int, stage: str, parent: Candidate, target: str | None, inp: ProposalInput,
                cid: str, proposer=None) -> Candidate:
        """Propose → check → validate (one revise) → evaluate; returns the archived candidate
        (status evaluated / rejected / failed). Acceptance is the caller's. ``proposer``: this
        attempt's proposer (default the run's; the integrator passes its offline merge)."""
        proposer = proposer or self.proposer
        cand = Candidate(cid, parent.id, round_no, stage, target, proposer.name)
        saved = self.dir.load_step(cid, "proposal")
        if saved is None:
            result = proposer.propose(inp, self.rng)
            _fault("proposal", round_no)
            saved = {"result": result.to_dict(), "rng": _rng_to_json(self.rng.getstate()),
                     "case_ids": inp.case_ids, "cases": inp.cases}
            self.dir.save_step(cid, "proposal", saved)
        else:
            self.rng.setstate(_rng_from_json(saved["rng"]))
        result = ProposalResult.from_dict(saved["result"])
        self.ledger.add(round_no, "coder", result.turns, result.prompt_tokens, result.completion_tokens)
        cand.description = result.description
        cand.edits = [e.to_dict() for e in result.edits] or ([{"whole_file": True}] if result.whole_file else [])
        if not result.ok:
            cand.status, cand.reason = "failed", result.reason
            self.archive.add(cand)
            return cand
        source, reason = result.source, self._check(result.source, parent)
        verdict = None
        if not reason:
            verdict = self._validate(cid, "validation", source, parent)
            if not verdict["ok"]:
                rev = self.dir.load_step(cid, "revise")
                if rev is None:
                    again = proposer.revise(inp, result, f"level {verdict['level']}: {verdict['reason']}",
                                                 self.rng)
                    rev = {"result": again.to_dict() if again else None, "rng": _rng_to_json(self.rng.getstate())}
                    self.dir.save_step(cid, "revise", rev)
                else:
                    self.rng.setstate(_rng_from_json(rev["rng"]))
                if rev["result"] is not None:
                    again = ProposalResult.from_dict(rev["result"])
                    extra = (again.turns - result.turns, again.prompt_tokens - result.prompt_tokens,
                             again.completion_tokens - result.completion_tokens)
                    self.ledger.add(round_no, "coder", *extra)
                    if again.ok:
                        source, reason = again.source, self._check(again.source, parent)
                        cand.edits = [e.to_dict() for e in again.edits] or [{"whole_file": True}]
                        if not reason:
                            verdict = self._validate(cid, "validation2", source, parent)
                reason = reason or ("" if verdict["ok"] else f"validation level {verdict['level']}: "
                                                             f"{verdict['reason']}")
        cand.validation = verdict
        try:
            cand.key = program_key(source)
        except SyntaxError:
            cand.key = None
        cand.program = f"candidates/{cid}/program.py"
        atomic_write_text(self.dir.cand(cid) / "program.py", source)
        if reason:
            cand.status, cand.reason = "rejected", reason
            self.archive.add(cand)
            return cand
        from evolution.execution.component_diff import diff_components
        parent_source = self.source_of(parent.id)
        cand.changed = list(diff_components(parent_source, source).changed)
        try:
            ev = self._evaluate_candidate(cand, source, parent_source, round_no)
        except ProgramRunError as e:
            cand.status, cand.reason = "rejected", f"evaluation failed: {e}"
            self.archive.add(cand)
            return cand
        self.ledger.add_usage(round_no, ev["usage"])
        cand.train, cand.valid = SplitScores(**ev["train"]), SplitScores(**ev["valid"])
        cand.status = "evaluated"
        self.archive.add(cand)
        return cand

    def _check(self, source: str, parent: Candidate) -> str:
        return precheck(source, parent, self.archive)

    def _validate(self, cid: str, name: str, source: str, parent: Candidate) -> dict:
        saved = self.dir.load_step(cid, name)
        if saved is None:
            saved = validate_program(source, self.source_of(parent.id), self.limits).to_dict()
            self.dir.save_step(cid, name, saved)
        return saved

    def run_round(self, round_no: int) -> None:
        """One cold-start or refinement round (integration rounds go to the integrator)."""
        stage = self.stage_of(round_no)
        if stage == "integrate":
            self.integrator.run_round(self, round_no, self.rng)
            return
        target = None
        if stage == "refine":
            target = self.target_policy.choose(self.archive, self.split_tasks("valid"), round_no, self.rng)
            if target is not None:  # a holistic policy refines without a target
                self.archive.selections[target] = self.archive.selections.get(target, 0) + 1
        parent = self.parent_policy.choose(self.archive, target)
        case_ids = self.case_policy.choose(self.archive, parent, target, self.split_tasks("train"), self.cfg.cases,
                                           self.rng)
        record_cases(self.archive, case_ids, self.tasks)
        inp = self.build_input(round_no, stage, parent, target, case_ids)
        cand = self.attempt(round_no, stage, parent, target, inp, f"r{round_no:02d}")
        accepted = self.acceptance.accept(self.archive, cand, stage, parent)
        self.record_round(round_no, stage, target, parent, cand, accepted)

    def record_round(self, round_no: int, stage: str, target: str | None, parent: Candidate, cand: Candidate,
                     accepted: str) -> None:
        """Book a finished attempt: its reason when not accepted, the target's failed
        attempts, ``outcome.json`` and the history row the report prints. Integrators call it
        for their own attempts."""
        if not accepted and cand.status == "evaluated":
            cand.reason = cand.reason or ("valid overall did not improve" if stage in ("cold", "integrate", "holistic")
                                          else "no capability's valid score improved")
        if not accepted:
            self.archive.attempts.setdefault(target or stage, []).append(cand.id)
        atomic_write_json(self.dir.step(cand.id, "outcome"), {
            "status": cand.status, "reason": cand.reason, "accepted": accepted, "roles": cand.roles,
            "valid": cand.valid.scores() if cand.valid else None, "train": cand.train.scores() if cand.train else None})
        self.history.append({"round": round_no, "stage": stage, "target": target, "parent": parent.id,
                             "candidate": cand.id, "proposal": cand.description, "status": cand.status,
                             "verdict": "ok" if cand.validation and cand.validation["ok"] else
                             (f"level {cand.validation['level']}" if cand.validation else "-"),
                             "accepted": accepted or f"no: {cand.reason}",
                             "valid": cand.valid.scores() if cand.valid else None,
                             "specialists": {c: self.archive.specialist(c).valid.by_capability.get(c)
                                             for c in self.archive.specialists},
                             "base": self.archive.base,
                             "base_overall": self.archive.get(self.archive.base).valid.overall,
                             "tokens": self.ledger.round_tokens(round_no)})

    # ------------------------------------------------------------------ the run

    def accepted_merges(self) -> list[str]:
        """Ids of the integration candidates that were accepted (history order)."""
        return [h["candidate"] for h in self.history if h.get("stage") == "integrate" and h.get("integrated")]

    def freeze(self) -> dict:
        """:func:`evolution.search.select.freeze_choice` over the base, every specialist and
        every accepted merge: ``{"frozen", "runner_up", "pool", "why"}``."""
        return freeze_choice(self.archive, self.accepted_merges())

    def final_program(self) -> str:
        """The frozen program's id: the best valid overall among the base, every specialist
        and every accepted merge (ties: the later one), :meth:`freeze`."""
        return self.freeze()["frozen"]

    def finish(self) -> dict:
        """Test runs (once, stored in ``final.json``), best.py, report.md, capabilities.png,
        summary.json. Returns the summary."""
        from evolution.search.report import write_reports

        final_id = self.final_program()
        fin = read_json(self.dir.root / "final.json")
        if fin is None:
            fin = {"final": final_id, "seed_test": None, "final_test": None, "usage": {}}
            if self.splits["test"]:
                for key, cid in (("seed_test", "seed"), ("final_test", final_id)):
                    if key == "final_test" and cid == "seed":
                        fin[key] = fin["seed_test"]
                        continue
                    ev, _ = self.evaluate(self.source_of(cid), "test")
                    fin[key] = self._scores(ev).__dict__
                    for role, u in usage_from_eval(ev).items():
                        self.ledger.add("final", role, u["calls"], u["prompt"], u["completion"])
                if self.cfg.test_specialists:  # report rows and the oracle-label router baseline
                    fin["specialists_test"] = {}
                    for cid in dict.fromkeys(self.archive.specialists.values()):
                        if cid in ("seed", final_id):
                            continue
                        ev, _ = self.evaluate(self.source_of(cid), "test")
                        fin["specialists_test"][cid] = self._scores(ev).__dict__
                        for role, u in usage_from_eval(ev).items():
                            self.ledger.add("final", role, u["calls"], u["prompt"], u["completion"])
            fin["baselines"] = self.evaluate_baselines()
            fin["ledger_final"] = self.ledger.rounds.get("final", {})
            atomic_write_json(self.dir.root / "final.json", fin)
        else:
            self.ledger.rounds["final"] = fin.get("ledger_final", {})
        atomic_write_text(self.dir.root / "best.py", self.source_of(final_id))
        self.save()
        return write_reports(self, fin)

    def evaluate_baselines(self) -> dict:
        """``{name: {"valid": SCORES, "test": SCORES or None}}`` of every recipe baseline
        (:data:`memory_bank.programs.BASELINES`), each run once on valid and, when the run
        has a test split, on test (calls booked on the ledger's ``final`` row). A baseline whose
        run fails (:class:`ProgramRunError`) gets None scores and ``error``."""
        from memory_bank.programs import baseline_program_path, read_program_source

        out = {}
        for name in self.cfg.baselines:
            source = read_program_source(baseline_program_path(name))
            row = {}
            for split in ("valid", "test"):
                if not self.splits[split]:
                    row[split] = None
                    continue
                try:
                    ev, _ = self.evaluate(source, split)
                except ProgramRunError as e:  # a baseline that cannot run here is reported, not fatal
                    row[split], row["error"] = None, f"{split}: {e}"
                    continue
                row[split] = self._scores(ev).__dict__
                for role, u in usage_from_eval(ev).items():
                    self.ledger.add("final", role, u["calls"], u["prompt"], u["completion"])
            out[name] = row
        return out

    def run(self, *, resume: bool = False) -> dict:
        """Run (or continue) the whole loop and write the reports; returns the summary dict.
        Holds the run directory's lock throughout (:func:`evolution.search.rundir.run_lock`);
        raises :class:`evolution.search.stops.EndpointUnreachable` (state saved) when the coder
        keeps failing."""
        with run_lock(self.dir.root):
            return self._run(resume)

    def _run(self, resume: bool) -> dict:
        if resume and not self.load() and not self.dir.recipe.exists():
            raise FileNotFoundError(f"nothing to resume in {self.dir.root}: no state.json or recipe.json")
        if not resume and self.dir.state.exists():
            raise FileExistsError(f"{self.dir.root} already holds a run; use --resume {self.dir.root}")
        if not self.archive.candidates:
            self.start()
            self.save()
        total = self.cfg.total_rounds
        bar = tqdm(total=total, initial=self.next_round - 1, desc="evolve rounds", unit="round",
                   disable=not self.cfg.progress)
        try:
            while self.next_round <= total and not self.stopped:
                try:
                    self.ledger.check()
                except BudgetExhausted as e:
                    self.stopped = str(e)
                    break
                self.run_round(self.next_round)
                self.next_round += 1
                self.save()
                _fault("round_end", self.next_round - 1)
                bar.update(1)
                check_endpoint(self.history, self.archive)
        finally:
            bar.close()
        self.save()
        return self.finish()
