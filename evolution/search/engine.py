"""The evolution engine (PrisMem Algorithm 1; docs/design.md § "Capability-driven evolution").

:class:`Engine` changes an :class:`~memgym.evolution.search.state.EvolutionState` round by round through
the stages of its :class:`~memgym.evolution.search.protocols.Strategy`: cold start (a child becomes the
base when valid overall improves), capability refinement (a child becomes the specialist of every
capability whose valid score it beats), integration (the integrator), and the final step (the
frozen program, the seed, specialists and baselines on test). A round is proposal → checks →
validation (one revise turn) → evaluation → acceptance → ``record_round``. Every finished step is
a journal record; ``run(resume=True)`` replays the interrupted round's finished steps from their
records, so nothing is proposed, validated or evaluated twice.
"""
from __future__ import annotations

from memgym.llm.errors import ConfigError, OutputPathError

from pathlib import Path

from memgym.evolution.execution.runner import ProgramRunError
from memgym.evolution.execution.validate import ValidationLimits, validate_program
from memgym.evolution.search.archive import CAPABILITIES, Archive, Candidate, program_key
from memgym.evolution.search.evaluator import Evaluator, book_final, split_scores
from memgym.evolution.search.journal import (FinalRecord, ProposalRecord, RoundRecord, ValidationRecord, load_final,
                                             load_record, rng_from_json, rng_to_json)
from memgym.evolution.search.ledger import BudgetExhausted, usage_from_eval
from memgym.evolution.search.proposers.base import ProposalInput
from memgym.evolution.search.protocols import Integrator, Proposer, RoundSteps, Strategy
from memgym.evolution.search.rundir import atomic_write_text
from memgym.evolution.search.select import record_cases
from memgym.evolution.search.state import EvolutionState
from memgym.evolution.search.stops import check_anything_proposed, check_endpoint


def precheck(source: str, parent: Candidate, archive: Archive) -> str:
    """Why a child is rejected before validation, or "": unparsable, a no-op (same
    :func:`program_key` as its parent) or a duplicate of an archived program."""
    try:
        key = program_key(source)
    except SyntaxError as e:
        return f"syntax error at line {e.lineno}: {e.msg}"
    if key == parent.key:
        return "no-op: the child equals its parent (up to comments and formatting)"
    dup = next((c.id for c in archive.candidates.values() if c.key == key), None)
    return f"duplicate of archived program {dup}" if dup else ""


class Engine:
    """One evolution run on ``state``; ``integrator`` None when there are no integration rounds."""

    def __init__(self, state: EvolutionState, strategy: Strategy, proposer: Proposer, evaluator: Evaluator,
                 limits: ValidationLimits, integrator: Integrator | None = None):
        self.state, self.cfg, self.strategy = state, state.cfg, strategy
        self.proposer, self.evaluator, self.limits, self.integrator = proposer, evaluator, limits, integrator
        self.replay = False  # True on --resume: finished steps are read back from the journal

    def _replayed(self, cid: str, step: str):
        return load_record(self.state.dir.root, cid, step) if self.replay else None

    def start(self) -> None:
        """Archive and evaluate the seed program (once)."""
        from memgym.memory_bank.programs import read_program_source, seed_program_path

        state = self.state
        src_path = Path(self.cfg.seed_program) if self.cfg.seed_program else seed_program_path()
        source = read_program_source(src_path)
        res = validate_program(source, None, self.limits)
        if not res.ok:
            raise ConfigError(f"the seed program fails validation level {res.level}: {res.reason}")
        cand = Candidate("seed", None, 0, "seed", None, "seed", key=program_key(source),
                         program="candidates/seed/program.py", description="seed program",
                         validation=res.to_dict())
        state.sources["seed"] = source
        self._evaluate(cand, source, None, 0)
        cand.status, cand.roles = "evaluated", ["base"] + [f"specialist:{c}" for c in CAPABILITIES]
        state.archive.add(cand)
        state.archive.base = "seed"
        state.archive.specialists = {c: "seed" for c in CAPABILITIES if c in cand.valid.by_capability}
        accepted = "base + all specialists"
        if not self.strategy.specialists:
            state.archive.specialists, cand.roles, accepted = {}, ["base"], "base"
        state.record(RoundRecord(0, "seed", None, None, "seed", "seed program", accepted))

    def build_input(self, round_no: int, stage: str, parent: Candidate, target: str | None,
                    case_ids: list[str]) -> ProposalInput:
        """The proposer's input (cases rendered only when ``needs_cases`` is not False)."""
        parent_source = self.state.source_of(parent.id)
        cases = []
        if case_ids and getattr(self.proposer, "needs_cases", True):
            cases = self.evaluator.case_texts(parent_source, case_ids)
        ancestors, failed = self.state.lineage(parent, target, stage)
        return ProposalInput(parent_source, parent.id, stage, target, self.state.diagnostics[parent.id], cases,
                             case_ids, ancestors, failed, frozenset(self.state.archive.keys()),
                             extra={"round": round_no})

    def _propose(self, cid: str, round_no: int, fn, inp: ProposalInput, revise: bool) -> ProposalRecord:
        """The proposal (or revise) record of ``cid``: replayed, else made by ``fn(rng)`` and emitted."""
        state = self.state
        rec = self._replayed(cid, "revise" if revise else "proposal")
        if rec is not None:
            state.rng.setstate(rng_from_json(rec.rng))
            return rec
        result = fn(state.rng)
        rec = ProposalRecord(cid, round_no, result, rng_to_json(state.rng.getstate()),
                             [] if revise else inp.case_ids, [] if revise else inp.cases, revise)
        state.emit(rec)
        return rec

    def attempt(self, round_no: int, stage: str, parent: Candidate, target: str | None, inp: ProposalInput,
                cid: str, proposer: Proposer | None = None) -> Candidate:
        """Propose → check → validate (one revise) → evaluate; returns the archived candidate.
        Acceptance is the caller's. ``proposer``: default the run's."""
        state = self.state
        proposer = proposer or self.proposer
        cand = Candidate(cid, parent.id, round_no, stage, target, proposer.name)
        result = self._propose(cid, round_no, lambda rng: proposer.propose(inp, rng), inp, False).result
        state.ledger.add(round_no, "coder", result.turns, result.prompt_tokens, result.completion_tokens,
                         result.estimated)
        cand.description = result.description
        cand.edits = [e.to_dict() for e in result.edits] or ([{"whole_file": True}] if result.whole_file else [])
        if not result.ok:
            cand.status, cand.reason = "failed", result.reason
            state.archive.add(cand)
            return cand
        source, reason = result.source, precheck(result.source, parent, state.archive)
        verdict = None
        if not reason:
            verdict = self._validate(cid, round_no, False, source, parent)
            if not verdict["ok"]:
                text = f"level {verdict['level']}: {verdict['reason']}"
                again = self._propose(cid, round_no, lambda rng: proposer.revise(inp, result, text, rng), inp,
                                      True).result
                if again is not None:
                    state.ledger.add(round_no, "coder", again.turns - result.turns,
                                     again.prompt_tokens - result.prompt_tokens,
                                     again.completion_tokens - result.completion_tokens,
                                     again.estimated - result.estimated)
                    if again.ok:
                        source, reason = again.source, precheck(again.source, parent, state.archive)
                        cand.edits = [e.to_dict() for e in again.edits] or [{"whole_file": True}]
                        if not reason:
                            verdict = self._validate(cid, round_no, True, source, parent)
                reason = reason or ("" if verdict["ok"] else f"validation level {verdict['level']}: "
                                                             f"{verdict['reason']}")
        cand.validation = verdict
        try:
            cand.key = program_key(source)
        except SyntaxError:
            cand.key = None
        cand.program = f"candidates/{cid}/program.py"
        state.sources[cid] = source
        if reason:
            cand.status, cand.reason = "rejected", reason
            state.archive.add(cand)
            return cand
        from memgym.evolution.execution.component_diff import diff_components
        parent_source = state.source_of(parent.id)
        cand.changed = list(diff_components(parent_source, source).changed)
        try:
            self._evaluate(cand, source, parent_source, round_no)
        except ProgramRunError as e:
            cand.status, cand.reason = "rejected", f"evaluation failed: {e}"
            state.archive.add(cand)
            return cand
        cand.status = "evaluated"
        state.archive.add(cand)
        return cand

    def _validate(self, cid: str, round_no: int, second: bool, source: str, parent: Candidate) -> dict:
        rec = self._replayed(cid, "validation2" if second else "validation")
        if rec is None:
            verdict = validate_program(source, self.state.source_of(parent.id), self.limits).to_dict()
            rec = ValidationRecord(cid, round_no, verdict, second)
            self.state.emit(rec)
        return rec.verdict

    def _evaluate(self, cand: Candidate, source: str, parent_source: str | None, round_no: int):
        """Train + valid evaluation of ``cand`` (replayed or run); books usage and diagnostics."""
        ev = self._replayed(cand.id, "eval")
        if ev is None:
            ev = self.evaluator.evaluate_candidate(cand.id, round_no, source, parent_source)
            self.state.emit(ev)
        self.state.ledger.add_usage(round_no, ev.usage)
        self.state.diagnostics[cand.id] = ev.diagnostics
        cand.train, cand.valid = ev.train, ev.valid
        return ev

    def stage_of(self, round_no: int) -> str:
        return self.strategy.stage_of(round_no, self.cfg)

    def run_round(self, round_no: int) -> None:
        """One round of the strategy's schedule (integration rounds go to the integrator)."""
        state, strategy = self.state, self.strategy
        stage = self.stage_of(round_no)
        if stage == "integrate":
            steps = RoundSteps(self.attempt, self.evaluator.case_texts, self.proposer.name)
            self.integrator.run_round(state, steps, round_no, state.rng)
            return
        target = None
        if stage == "refine":
            target = strategy.target.choose(state.archive, state.split_tasks("valid"), round_no, state.rng)
            if target is not None:
                state.archive.selections[target] = state.archive.selections.get(target, 0) + 1
        parent = strategy.parent.choose(state.archive, target)
        first, parent = parent, self.fallback_parent(parent, target)
        case_ids = strategy.cases.choose(state.archive, parent, target, state.split_tasks("train"), self.cfg.cases,
                                         state.rng)
        record_cases(state.archive, case_ids, state.tasks)
        inp = self.build_input(round_no, stage, parent, target, case_ids)
        cand = self.attempt(round_no, stage, parent, target, inp, f"r{round_no:02d}")
        accepted = strategy.acceptance.accept(state.archive, cand, stage, parent)
        state.record_round(round_no, stage, target, parent, cand, accepted,
                           fallback_from=first.id if parent.id != first.id else None)

    def fallback_parent(self, parent: Candidate, target: str | None) -> Candidate:
        """``parent``, or, when the proposer is ``exhausted`` on it, the first of the parent
        policy's ``fallbacks(archive, target)`` it is not exhausted on (deterministic)."""
        exhausted = getattr(self.proposer, "exhausted", None)
        more = getattr(self.strategy.parent, "fallbacks", None)
        if exhausted is None or more is None or target is None:
            return parent
        for cand in [parent] + more(self.state.archive, target):
            if not exhausted(self.build_input(0, "refine", cand, target, [])):
                return cand
        return parent

    def final_runs(self) -> dict:
        """The final step (once; replayed on resume): frozen program, seed, specialists when
        ``test_specialists``, baselines on test, each reported per conversation (one that fails
        is listed in its scores' ``failed`` and scored 0, the others run on). Returns the
        :class:`FinalRecord`'s dict."""
        state = self.state
        stored = load_final(state.dir.root) if self.replay else None
        if stored is not None:
            state.ledger.rounds["final"] = stored.runs.get("ledger_final", {})
            return stored.runs
        final_id = state.freeze()["frozen"]  # best valid overall: base, specialists, accepted merges
        fin = {"final": final_id, "seed_test": None, "final_test": None, "usage": {}}
        if state.splits["test"]:
            for key, cid in (("final_test", final_id), ("seed_test", "seed")):  # frozen first: whole cost
                if key == "seed_test" and cid == final_id:
                    fin[key] = fin["final_test"]
                    continue
                ev, _ = self.evaluator.evaluate(state.source_of(cid), "test", keep_going=True)
                fin[key] = split_scores(ev).__dict__
                book_final(state.ledger, ev)
                if key == "final_test":
                    fin["final_test_usage"] = usage_from_eval(ev)
            if self.cfg.test_specialists:  # report rows and the oracle-label router baseline
                fin["specialists_test"] = {}
                for cid in dict.fromkeys(state.archive.specialists.values()):
                    if cid in ("seed", final_id):
                        continue
                    ev, _ = self.evaluator.evaluate(state.source_of(cid), "test", keep_going=True)
                    fin["specialists_test"][cid] = split_scores(ev).__dict__
                    book_final(state.ledger, ev)
        fin["baselines"] = self.evaluator.baselines(self.cfg.baselines, state.ledger)
        fin["ledger_final"] = state.ledger.rounds.get("final", {})
        state.emit(FinalRecord(fin))
        return fin

    def run(self, *, resume: bool = False):
        """Run (or continue, ``resume``) the loop; returns the :class:`EvolveResult`. Writes the
        recipe on a fresh start, the state after every round and at the end, then best.py and the
        reports (:func:`memgym.evolution.search.report.write_reports`). The caller holds the run
        dir's lock. Raises :class:`EndpointUnreachable` (state saved) when the
        coder's endpoint keeps failing, or, after the run is written, when it failed every round."""
        from memgym.evolution.search.report import write_reports
        from memgym.evolution.search.result import build_result

        state = self.state
        if resume and not state.load() and not state.dir.recipe.exists():
            raise ConfigError(f"nothing to resume in {state.dir.root}: no state.json or recipe.json")
        if not resume and state.dir.state.exists():
            raise OutputPathError(f"{state.dir.root} already holds a run; use --resume {state.dir.root}")
        self.replay = resume
        state.write_recipe()
        state.notify("on_run_start", resume)
        if not state.archive.candidates:
            self.start()
            self.end_round(0)
        try:
            while state.next_round <= self.cfg.total_rounds and not state.stopped:
                try:
                    state.ledger.check()
                except BudgetExhausted as e:
                    state.stopped = str(e)
                    break
                state.notify("on_round_start", state.next_round)
                self.run_round(state.next_round)
                state.next_round += 1
                self.end_round(state.next_round - 1)
                check_endpoint(state.history, state.archive)
        finally:
            state.notify("on_loop_end")
        fin = self.final_runs()
        state.tick()
        result = build_result(state, fin, rt=self.evaluator.rt)
        atomic_write_text(state.dir.root / "best.py", result.frozen.source)
        state.save()
        write_reports(state, result.summary)
        state.notify("on_run_end", result)
        check_anything_proposed(state.history, state.archive, state.dir.root)
        return result

    def end_round(self, round_no: int) -> None:
        """The checkpoint after round ``round_no`` (:meth:`EvolutionState.save`), then the callbacks."""
        self.state.save()
        self.state.notify("on_round_end", round_no)
