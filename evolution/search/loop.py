"""The evolution engine (PrisMem Algorithm 1; DESIGN.md § "Capability-driven evolution").

Three parts, as GEPA splits them: the run's state (:class:`evolution.search.state.EvolutionState`:
archive, ledger, history, RNG, ``state.json``), the evaluator
(:class:`evolution.search.evaluator.Evaluator`: programs on splits, ``eval.json``, compact
cases from the kept train traces) and this engine, which changes the state round by round.
The integrator and the reporter (:mod:`evolution.search.report`) receive the state, never the
engine.

:class:`Evolution` runs, round by round: **cold start** (``rounds_cold``: the proposer sees the
diagnostics table and compact cases spread over capabilities; a child becomes the new base
when the valid overall score improves), **capability refinement** (``rounds_refine``: target
by the target policy, parent by the parent policy, cases by the case policy; a child becomes
the specialist of every capability whose valid score it beats; when the proposer has nothing
left to try on that parent, the round refines the policy's next fallback parent for the same
target, :meth:`Evolution.fallback_parent`), then **integration**
(``rounds_integrate``, a hook: the ``integrator`` object, by default
:class:`evolution.search.integrate.TraceGuidedIntegrator`) and the
**final** step: the frozen program (:meth:`EvolutionState.final_program`: the best valid overall
among the base, every specialist and every accepted merge, ties to the later one) runs once on
the test split, beside the seed and every specialist.

Plug-in points (all small objects, swapped for ablations): ``target_policy``,
``parent_policy``, ``case_policy``, ``acceptance`` (:mod:`evolution.search.select`),
``proposer`` (:mod:`evolution.search.proposers`), ``integrator`` (an object with
``run_round(state, steps, round_no, rng)`` and ``final(state) -> candidate id``;
``rounds_integrate`` rounds go to it, after refinement; ``steps`` is a
:class:`evolution.search.integrate.RoundSteps`: the engine's :meth:`Evolution.attempt`, the
evaluator's compact cases and the proposer's name). A round is one proposal → checks →
validation (one revise turn on failure) → evaluation on train and valid → acceptance →
:meth:`EvolutionState.record_round`; :meth:`Evolution.attempt` does the first steps for any
stage, so an integrator reuses it (it passes its extra material in ``ProposalInput.extra``),
then applies its own acceptance rule and calls ``state.record_round``. Integrator state that must
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
import signal
from pathlib import Path

from tqdm.auto import tqdm

from evolution.execution.runner import ProgramRunError
from evolution.execution.sandbox import SandboxLimits
from evolution.execution.stages import StageCache
from evolution.execution.validate import ValidationLimits, validate_program
from evolution.search.archive import CAPABILITIES, Archive, Candidate, SplitScores, program_key
from evolution.search.config import EvolveConfig
from evolution.search.evaluator import Evaluator, book_final, split_scores
from evolution.search.integrate import RoundSteps
from evolution.search.ledger import BudgetExhausted, usage_from_eval
from evolution.search.proposers.base import ProposalInput, ProposalResult
from evolution.search.rundir import atomic_write_json, atomic_write_text, read_json, run_lock
from evolution.search.select import (CapabilityAcceptance, DependencyAwareTarget, HistoryGuidedCases,
                                     SpecialistParent, record_cases)
from evolution.search.state import EvolutionState, rng_from_json, rng_to_json
from evolution.search.stops import check_endpoint

FAULT_ENV = "MEMGYM_EVOLVE_FAULT"


def _fault(point: str, round_no) -> None:
    spec = os.environ.get(FAULT_ENV, "")
    if spec and spec == f"{point}:{round_no}":
        os.kill(os.getpid(), signal.SIGKILL)


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
        self.state = EvolutionState(cfg)
        if rt is None:
            from llm.runtime import Runtime
            cache = cfg.cache or str(self.state.dir.root / "responses.sqlite")
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
                                               offline_first=cfg.integrate_offline_first, onto=cfg.integrate_onto,
                                               condition=cfg.integrate_condition)
        self.integrator = integrator
        self.proposer = proposer or make_proposer(cfg, rt)
        self.cache = StageCache(cfg.stage_cache or self.state.dir.root / "stages.sqlite")
        self.evaluator = Evaluator(rt, cfg, self.cache, self.state.splits)
        self.runner = self.evaluator.runner
        self.limits = ValidationLimits(
            sandbox=SandboxLimits(call_timeout_s=cfg.validate_timeout_s, load_timeout_s=max(10.0, cfg.validate_timeout_s)),
            probe_units=cfg.probe_units, probe_batches=cfg.probe_batches)

    # ------------------------------------------------------------------ evaluation

    def evaluate(self, source: str, split: str, *, parent_source: str | None = None, diagnostics: bool = False):
        """(:class:`ProgramEvaluation`, ProgramRun) of ``source`` on ``split``."""
        return self.evaluator.evaluate(source, split, parent_source=parent_source, diagnostics=diagnostics)

    def _evaluate_candidate(self, cand: Candidate, source: str, parent_source: str | None, round_no) -> dict:
        return self.evaluator.evaluate_candidate(self.state.dir, cand.id, source, parent_source,
                                                 between=lambda: _fault("evaluation", round_no))

    # ------------------------------------------------------------------ seed

    def start(self) -> None:
        """Archive and evaluate the seed program (once)."""
        from memory_bank.programs import read_program_source, seed_program_path

        src_path = Path(self.cfg.seed_program) if self.cfg.seed_program else seed_program_path()
        source = read_program_source(src_path)
        atomic_write_text(self.state.dir.root / "seed.py", source)
        res = validate_program(source, None, self.limits)
        if not res.ok:
            raise ValueError(f"the seed program fails validation level {res.level}: {res.reason}")
        cand = Candidate("seed", None, 0, "seed", None, "seed", key=program_key(source),
                         program="candidates/seed/program.py", description="seed program",
                         validation=res.to_dict())
        atomic_write_text(self.state.dir.cand("seed") / "program.py", source)
        ev = self._evaluate_candidate(cand, source, None, 0)
        cand.train, cand.valid = SplitScores(**ev["train"]), SplitScores(**ev["valid"])
        cand.status, cand.roles = "evaluated", ["base"] + [f"specialist:{c}" for c in CAPABILITIES]
        self.state.ledger.add_usage(0, ev["usage"])
        self.state.archive.add(cand)
        self.state.archive.base = "seed"
        self.state.archive.specialists = {c: "seed" for c in CAPABILITIES if c in cand.valid.by_capability}
        self.state.history.append({"round": 0, "stage": "seed", "target": None, "parent": None, "candidate": "seed",
                             "proposal": "seed program", "verdict": "ok", "status": "evaluated",
                             "accepted": "base + all specialists", "valid": cand.valid.scores(),
                             "tokens": self.state.ledger.round_tokens(0)})

    # ------------------------------------------------------------------ one round

    def stage_of(self, round_no: int) -> str:
        c, r = self.cfg.rounds_cold, self.cfg.rounds_refine
        return "cold" if round_no <= c else "refine" if round_no <= c + r else "integrate"

    def build_input(self, round_no: int, stage: str, parent: Candidate, target: str | None,
                    case_ids: list[str]) -> ProposalInput:
        """The proposer's input: parent source, diagnostics, compact cases (rendered only for
        proposers whose ``needs_cases`` is not False; the ids are always kept), lineage."""
        parent_source = self.state.source_of(parent.id)
        diag = self.state.dir.load_step(parent.id, "eval")["diagnostics"]
        cases = []
        if case_ids and getattr(self.proposer, "needs_cases", True):
            cases = self.evaluator.case_texts(parent_source, case_ids)
        ancestors, failed = self.state.lineage(parent, target, stage)
        return ProposalInput(parent_source, parent.id, stage, target, diag, cases, case_ids, ancestors, failed,
                             frozenset(self.state.archive.keys()), extra={"round": round_no})

    def attempt(self, round_no: int, stage: str, parent: Candidate, target: str | None, inp: ProposalInput,
                cid: str, proposer=None) -> Candidate:
        """Propose → check → validate (one revise) → evaluate; returns the archived candidate
        (status evaluated / rejected / failed). Acceptance is the caller's. ``proposer``: this
        attempt's proposer (default the run's; the integrator passes its offline merge)."""
        proposer = proposer or self.proposer
        cand = Candidate(cid, parent.id, round_no, stage, target, proposer.name)
        saved = self.state.dir.load_step(cid, "proposal")
        if saved is None:
            result = proposer.propose(inp, self.state.rng)
            _fault("proposal", round_no)
            saved = {"result": result.to_dict(), "rng": rng_to_json(self.state.rng.getstate()),
                     "case_ids": inp.case_ids, "cases": inp.cases}
            self.state.dir.save_step(cid, "proposal", saved)
        else:
            self.state.rng.setstate(rng_from_json(saved["rng"]))
        result = ProposalResult.from_dict(saved["result"])
        self.state.ledger.add(round_no, "coder", result.turns, result.prompt_tokens, result.completion_tokens)
        cand.description = result.description
        cand.edits = [e.to_dict() for e in result.edits] or ([{"whole_file": True}] if result.whole_file else [])
        if not result.ok:
            cand.status, cand.reason = "failed", result.reason
            self.state.archive.add(cand)
            return cand
        source, reason = result.source, self._check(result.source, parent)
        verdict = None
        if not reason:
            verdict = self._validate(cid, "validation", source, parent)
            if not verdict["ok"]:
                rev = self.state.dir.load_step(cid, "revise")
                if rev is None:
                    again = proposer.revise(inp, result, f"level {verdict['level']}: {verdict['reason']}",
                                                 self.state.rng)
                    rev = {"result": again.to_dict() if again else None, "rng": rng_to_json(self.state.rng.getstate())}
                    self.state.dir.save_step(cid, "revise", rev)
                else:
                    self.state.rng.setstate(rng_from_json(rev["rng"]))
                if rev["result"] is not None:
                    again = ProposalResult.from_dict(rev["result"])
                    extra = (again.turns - result.turns, again.prompt_tokens - result.prompt_tokens,
                             again.completion_tokens - result.completion_tokens)
                    self.state.ledger.add(round_no, "coder", *extra)
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
        atomic_write_text(self.state.dir.cand(cid) / "program.py", source)
        if reason:
            cand.status, cand.reason = "rejected", reason
            self.state.archive.add(cand)
            return cand
        from evolution.execution.component_diff import diff_components
        parent_source = self.state.source_of(parent.id)
        cand.changed = list(diff_components(parent_source, source).changed)
        try:
            ev = self._evaluate_candidate(cand, source, parent_source, round_no)
        except ProgramRunError as e:
            cand.status, cand.reason = "rejected", f"evaluation failed: {e}"
            self.state.archive.add(cand)
            return cand
        self.state.ledger.add_usage(round_no, ev["usage"])
        cand.train, cand.valid = SplitScores(**ev["train"]), SplitScores(**ev["valid"])
        cand.status = "evaluated"
        self.state.archive.add(cand)
        return cand

    def _check(self, source: str, parent: Candidate) -> str:
        return precheck(source, parent, self.state.archive)

    def _validate(self, cid: str, name: str, source: str, parent: Candidate) -> dict:
        saved = self.state.dir.load_step(cid, name)
        if saved is None:
            saved = validate_program(source, self.state.source_of(parent.id), self.limits).to_dict()
            self.state.dir.save_step(cid, name, saved)
        return saved

    def run_round(self, round_no: int) -> None:
        """One cold-start or refinement round (integration rounds go to the integrator)."""
        stage = self.stage_of(round_no)
        if stage == "integrate":
            steps = RoundSteps(self.attempt, self.evaluator.case_texts, self.proposer.name)
            self.integrator.run_round(self.state, steps, round_no, self.state.rng)
            return
        target = None
        if stage == "refine":
            target = self.target_policy.choose(self.state.archive, self.state.split_tasks("valid"), round_no, self.state.rng)
            if target is not None:  # a holistic policy refines without a target
                self.state.archive.selections[target] = self.state.archive.selections.get(target, 0) + 1
        parent = self.parent_policy.choose(self.state.archive, target)
        first, parent = parent, self.fallback_parent(parent, target)
        case_ids = self.case_policy.choose(self.state.archive, parent, target, self.state.split_tasks("train"), self.cfg.cases,
                                           self.state.rng)
        record_cases(self.state.archive, case_ids, self.state.tasks)
        inp = self.build_input(round_no, stage, parent, target, case_ids)
        cand = self.attempt(round_no, stage, parent, target, inp, f"r{round_no:02d}")
        accepted = self.acceptance.accept(self.state.archive, cand, stage, parent)
        self.state.record_round(round_no, stage, target, parent, cand, accepted)
        if parent.id != first.id:
            self.state.history[-1]["fallback_from"] = first.id
            self.state.history[-1]["proposal"] = f"[parent fallback: {first.id} has nothing left to try] " + \
                (self.state.history[-1]["proposal"] or "")

    def fallback_parent(self, parent: Candidate, target: str | None) -> Candidate:
        """``parent``, or, when the proposer says it has nothing left to try on it (its optional
        ``exhausted(ProposalInput) -> bool``), the first of the parent policy's optional
        ``fallbacks(archive, target)`` it has something for (DESIGN.md: a round is a proposal;
        issue 20: parent fallback). Deterministic given the archive, so a resumed round picks
        the same parent."""
        exhausted = getattr(self.proposer, "exhausted", None)
        more = getattr(self.parent_policy, "fallbacks", None)
        if exhausted is None or more is None or target is None:
            return parent
        for cand in [parent] + more(self.state.archive, target):
            if not exhausted(self.build_input(0, "refine", cand, target, [])):
                return cand
        return parent

    # ------------------------------------------------------------------ the run

    def finish(self) -> dict:
        """Test runs (once, stored in ``final.json``), best.py, report.md, capabilities.png,
        summary.json. Returns the summary."""
        from evolution.search.report import write_reports

        final_id = self.state.final_program()
        fin = read_json(self.state.dir.root / "final.json")
        if fin is None:
            fin = {"final": final_id, "seed_test": None, "final_test": None, "usage": {}}
            if self.state.splits["test"]:
                for key, cid in (("final_test", final_id), ("seed_test", "seed")):  # frozen first: whole cost
                    if key == "seed_test" and cid == final_id:
                        fin[key] = fin["final_test"]
                        continue
                    ev, _ = self.evaluate(self.state.source_of(cid), "test")
                    fin[key] = split_scores(ev).__dict__
                    book_final(self.state.ledger, ev)
                    if key == "final_test":
                        fin["final_test_usage"] = usage_from_eval(ev)
                if self.cfg.test_specialists:  # report rows and the oracle-label router baseline
                    fin["specialists_test"] = {}
                    for cid in dict.fromkeys(self.state.archive.specialists.values()):
                        if cid in ("seed", final_id):
                            continue
                        ev, _ = self.evaluate(self.state.source_of(cid), "test")
                        fin["specialists_test"][cid] = split_scores(ev).__dict__
                        book_final(self.state.ledger, ev)
            fin["baselines"] = self.evaluator.baselines(self.cfg.baselines, self.state.ledger)
            fin["ledger_final"] = self.state.ledger.rounds.get("final", {})
            atomic_write_json(self.state.dir.root / "final.json", fin)
        else:
            self.state.ledger.rounds["final"] = fin.get("ledger_final", {})
        atomic_write_text(self.state.dir.root / "best.py", self.state.source_of(final_id))
        self.state.save()
        return write_reports(self.state, fin)

    def run(self, *, resume: bool = False) -> dict:
        """Run (or continue) the whole loop and write the reports; returns the summary dict.
        Holds the run directory's lock throughout (:func:`evolution.search.rundir.run_lock`);
        raises :class:`evolution.search.stops.EndpointUnreachable` (state saved) when the coder
        keeps failing."""
        with run_lock(self.state.dir.root):
            return self._run(resume)

    def _run(self, resume: bool) -> dict:
        if resume and not self.state.load() and not self.state.dir.recipe.exists():
            raise FileNotFoundError(f"nothing to resume in {self.state.dir.root}: no state.json or recipe.json")
        if not resume and self.state.dir.state.exists():
            raise FileExistsError(f"{self.state.dir.root} already holds a run; use --resume {self.state.dir.root}")
        if not self.state.archive.candidates:
            self.start()
            self.state.save()
        total = self.cfg.total_rounds
        bar = tqdm(total=total, initial=self.state.next_round - 1, desc="evolve rounds", unit="round",
                   disable=not self.cfg.progress)
        try:
            while self.state.next_round <= total and not self.state.stopped:
                try:
                    self.state.ledger.check()
                except BudgetExhausted as e:
                    self.state.stopped = str(e)
                    break
                self.run_round(self.state.next_round)
                self.state.next_round += 1
                self.state.save()
                _fault("round_end", self.state.next_round - 1)
                bar.update(1)
                check_endpoint(self.state.history, self.state.archive)
        finally:
            bar.close()
        self.state.save()
        return self.finish()
