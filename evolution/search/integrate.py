"""Trace-guided integration (PrisMem stage III): consolidate the capability specialists into one
program. Source: docs/design.md § "Capability-driven evolution", step 3.

- paired differential case (:func:`paired_cases`), acceptance (:func:`integration_verdict`),
  blame (:func:`blame`, :func:`blame_elements`): :mod:`memgym.evolution.search.integration_rules`.
- merged onto (:meth:`TraceGuidedIntegrator.anchor`): the last accepted merge, else recipe
  ``integrate_onto``: ``base`` or ``best`` (best valid overall among base and specialists).
- attempts (one per integration round): the offline merge (:mod:`memgym.evolution.search.merge`; the
  whole integration of ``params``, the coder's first try); after a failure, optionally its
  condition-level form (:mod:`memgym.evolution.search.condition`), then an element-level retry leaving
  out the blamed elements; an LLM proposer instead gets diffs and paired-case traces.
- every attempt is one :class:`~memgym.evolution.search.archive.IntegrationRecord` in the archive's
  integration log (and one round record, stage ``integrate``); the integrator keeps no state of its
  own (all read back from the archive), so a resumed run continues exactly.
"""
from __future__ import annotations

import difflib
import random
from dataclasses import dataclass

from memgym.evolution.search.archive import CAPABILITIES, Candidate, IntegrationRecord, program_key
from memgym.evolution.search.condition import CONDITION_RULES, QuestionReader, condition_merge, condition_plan
from memgym.evolution.search.integration_rules import (DEFAULT_DELTA, blame, blame_elements, common_ancestor,
                                                integration_verdict, paired_case, paired_cases, worst_drop)
from memgym.evolution.search.journal import RoundRecord
from memgym.evolution.search.merge import Contender, MergeError, component_merge, element_key
from memgym.evolution.search.proposers.base import ProposalInput, ProposalResult
from memgym.evolution.search.protocols import RoundSteps

__all__ = ["DEFAULT_DELTA", "MergeProposer", "OFFLINE_PROPOSERS", "TraceGuidedIntegrator", "blame",
           "blame_elements", "common_ancestor", "integration_verdict", "paired_case", "paired_cases", "unified_diff"]

OFFLINE_PROPOSERS = ("params",)



@dataclass
class MergeProposer:
    """Proposes a fixed, precomputed merge, so the loop validates, evaluates and stores it."""

    source: str
    description: str
    detail: str = ""
    name: str = "merge"

    def propose(self, inp: ProposalInput, rng: random.Random) -> ProposalResult:
        return ProposalResult(True, self.source, [], True, self.description,
                              transcript=[{"role": "merge", "content": self.detail}])

    def revise(self, inp, result, verdict, rng):
        return None


def unified_diff(a: str, b: str, name_a: str, name_b: str, max_chars: int = 6000) -> str:
    """A unified diff of two sources, cut to ``max_chars`` characters (cut marked)."""
    text = "".join(difflib.unified_diff(a.splitlines(keepends=True), b.splitlines(keepends=True), name_a, name_b, n=2))
    return text if len(text) <= max_chars else text[:max_chars] + "\n... (diff cut)\n"



class TraceGuidedIntegrator:
    """The loop's integration hook (``run_round(state, steps, round_no, rng)``, ``final(state)``).

    ``delta``: acceptance tolerance; ``random_cases``: paired cases drawn at random (ablation);
    ``offline_first``: an LLM proposer's first attempt is the offline merge; ``onto``: ``base``
    (PrisMem) or ``best`` (best valid overall among base and specialists); ``condition``: a
    :data:`CONDITION_RULES` rule for the condition-level retry.
    """

    name = "trace_guided"

    def __init__(self, delta: float = DEFAULT_DELTA, *, random_cases: bool = False, offline_first: bool = True,
                 onto: str = "base", condition: str = "none"):
        if delta < 0:
            raise ValueError(f"delta must be >= 0, got {delta}")
        if onto not in ("base", "best"):
            raise ValueError(f"onto must be base or best, got {onto!r}")
        if condition not in CONDITION_RULES:
            raise ValueError(f"condition must be one of {', '.join(CONDITION_RULES)}, got {condition!r}")
        self.delta, self.random_cases, self.offline_first, self.onto = delta, random_cases, offline_first, onto
        self.condition = condition

    def anchor(self, state) -> Candidate:
        """The program merged onto: the last accepted merge once there is one (later rounds add
        the remaining specialists onto it), else by ``onto``: the base, or the best single
        program (:func:`memgym.evolution.search.select.freeze_choice` without merges)."""
        arch = state.archive
        if arch.merges():
            return arch.get(arch.merges()[-1].candidate)
        if self.onto == "base":
            return arch.get(arch.base)
        from memgym.evolution.search.select import freeze_choice
        return arch.get(freeze_choice(arch, [])["frozen"])

    @staticmethod
    def phase(state) -> list[IntegrationRecord]:
        """The integration attempts since the last accepted merge (all of them before one)."""
        log = state.archive.integrations
        done = [i for i, r in enumerate(log) if r.integrated]
        return log[done[-1] + 1:] if done else log

    @staticmethod
    def evaluated(state, rec: IntegrationRecord) -> bool:
        """Whether ``rec`` judged an evaluated program."""
        return rec.candidate != "-" and state.archive.get(rec.candidate).status == "evaluated"

    def final(self, state) -> str:
        """The last accepted merge's id, else the base's."""
        done = state.archive.merges()
        return done[-1].candidate if done else state.archive.base

    def specialists(self, state) -> list[Candidate]:
        """Distinct specialists that can contribute: not the anchor, not an ancestor of it."""
        arch = state.archive
        base_line = {c.id for c in arch.lineage(self.anchor(state).id)}
        out = []
        for cap in CAPABILITIES:
            sid = arch.specialists.get(cap)
            if sid and sid not in base_line and sid not in [s.id for s in out]:
                out.append(arch.get(sid))
        return out

    def run_round(self, state, steps: RoundSteps, round_no: int, rng: random.Random) -> None:
        arch = state.archive
        base = self.anchor(state)
        row = IntegrationRecord(round_no, base.id)
        onto_merge = bool(arch.merges())
        specs = self.specialists(state)
        if not specs:
            onto = "the base" if base.id == arch.base else f"the program merged onto ({base.id})"
            self._log(state, row, "nothing to integrate", f"skipped: every specialist is {onto} or its ancestor")
            return
        caps_of = {s.id: "".join(c for c in CAPABILITIES if arch.specialists.get(c) == s.id) for s in specs}
        merges = [r for r in self.phase(state) if r.attempt == "merge"]
        # an LLM proposer's first try since the last accepted merge is the offline merge
        use_merge = steps.proposer_name in OFFLINE_PROPOSERS or (self.offline_first and not merges)
        include, exclude = [s.id for s in specs], set()
        if use_merge and merges and self.condition != "none":  # a failed merge first gets its condition-level form
            last = merges[-1]
            tried = {r.merged_side for r in self.phase(state) if r.attempt == "condition"}
            if self.evaluated(state, last) and not last.integrated and last.candidate not in tried:
                self._condition_attempt(state, steps, round_no, row, last)
                return
        if use_merge and merges:  # a retry leaves out what was blamed since the last accepted merge
            if any(r.stuck for r in merges):
                self._log(state, row, "no merge left to try", f"skipped: the program merged onto ({base.id}) "
                                                              "cannot be split into elements")
                return
            whole = {r.blamed for r in merges if r.blamed and not r.left_out}
            include = [i for i in include if i not in whole]
            exclude = {(sid, k) for r in merges for sid, k in r.left_out}
            if not include:
                self._log(state, row, "no merge left to try", "skipped: every specialist was left out")
                return
        paired = paired_cases(arch, state.split_tasks("train"), rng, self.random_cases, set(include), base.id)
        row.paired = paired
        if use_merge:
            self._merge_attempt(state, steps, round_no, row, [arch.get(i) for i in include], caps_of, paired,
                                exclude, onto_merge)
        else:
            self._coder_attempt(state, steps, round_no, row, specs, caps_of, paired, self.phase(state))

    @staticmethod
    def _log(state, row: IntegrationRecord, proposal: str, accepted: str) -> None:
        """Book an attempt that made no candidate of this round."""
        row.accepted = accepted
        state.log_integration(row)
        state.record(RoundRecord(row.round, "integrate", None, row.anchor, row.candidate, proposal, accepted))

    def _cid(self, round_no: int) -> str:
        return f"r{round_no:02d}"

    def _merge_attempt(self, state, steps, round_no, row, include: list[Candidate], caps_of, paired,
                       exclude: set, onto_merge: bool) -> None:
        arch = state.archive
        base = arch.get(row.anchor)
        cases = {p["task"] for p in paired.values()}
        conts = [Contender(s.id, state.source_of(s.id), caps_of[s.id], {t: s.train.tasks.get(t, 0.0) for t in cases},
                           s.train.overall) for s in include]
        ancestors = {s.id: state.source_of(common_ancestor(arch, s.id, base.id)) for s in include}
        row.attempt, row.merged_from = "merge", [f"{s.id} ({caps_of[s.id]})" for s in include]
        row.excluded = sorted([sid, k] for sid, k in exclude)
        try:
            lineages = {x.id: [state.source_of(c.id) for c in arch.lineage(x.id)] for x in [base] + include}
            base_c = Contender(base.id, state.source_of(base.id), "", {t: base.train.tasks.get(t, 0.0) for t in cases},
                               base.train.overall)  # conflicts are settled on both sides' train scores
            res = component_merge(base_c, conts, ancestors,
                                  {c: p["task"] for c, p in paired.items()}, exclude, lineages)
        except MergeError as e:  # a program that cannot be split is left out next time
            # (the program merged onto cannot be left out: no retry)
            if str(e).startswith(f"{base.id}:"):
                row.stuck = True
            else:
                row.blamed = next((s.id for s in include if str(e).startswith(f"{s.id}:")), include[-1].id)
            self._log(state, row, "component merge", f"no: merge failed: {e}")
            return
        if not res.contributors:
            what = f"the accepted merge {base.id}" if onto_merge else base.id
            self._log(state, row, "component merge", f"skipped: the specialists add nothing to {what} (every "
                                                     "change is in it or was left out)")
            return
        row.conflicts = [c.to_dict() for c in res.conflicts]
        row.components = res.components
        row.contributor_caps = "".join(c for c in CAPABILITIES if any(c in caps_of[i] for i in res.contributors))
        supplied = {sid: sorted(k for k, pid in res.provenance.items() if pid == sid) for sid in res.contributors}
        desc = "component merge of " + ", ".join(f"{s.id} ({caps_of[s.id]})" for s in include) + \
            (f" onto {base.id}" if base.id != arch.base else "") + (" (elements left out)" if exclude else "")
        detail = "\n".join([desc, "components: " + str(res.components),
                            "conflicts: " + str([c.to_dict() for c in res.conflicts])])
        self._evaluate(state, steps, round_no, row, res.source, desc, detail,
                       [s for s in include if s.id in res.contributors], supplied)

    def _evaluate(self, state, steps, round_no, row, source: str, desc: str, detail: str,
                  contributors: list[Candidate], supplied: dict | None = None) -> None:
        """Evaluate a merge's ``source`` (or reuse the archived program equal to it up to statement
        order) and judge it."""
        arch = state.archive
        base = arch.get(row.anchor)
        key, ekey = program_key(source), element_key(source)
        same = next((c for c in arch.candidates.values() if c.status == "evaluated" and
                     (c.key == key or element_key(state.source_of(c.id)) == ekey)), None)
        if same is not None:  # the merge is an archived program, up to statement order: reuse its scores
            row.candidate = same.id
            self._judge(state, row, same, contributors, supplied,
                        proposal=desc + f" = archived {same.id} (scores reused)")
            return
        inp = ProposalInput(state.source_of(base.id), base.id, "integrate", None, {}, [], [], [], [],
                            frozenset(arch.keys()), extra={"round": round_no})
        cand = steps.attempt(round_no, "integrate", base, None, inp, self._cid(round_no),
                             proposer=MergeProposer(source, desc, detail))
        row.candidate = cand.id
        self._judge(state, row, cand, contributors, supplied)

    def _condition_attempt(self, state, steps, round_no, row, failed: IntegrationRecord) -> None:
        """Condition-level form (:func:`condition_merge`) of the failed offline merge ``failed``
        onto the anchor, the :class:`QuestionReader` trained on train questions."""
        arch = state.archive
        base = arch.get(row.anchor)
        dropped = [c for c in CAPABILITIES if failed.drops.get(c, 0.0) > self.delta + 1e-9]
        row.attempt, row.merged_from, row.merged_side = "condition", list(failed.merged_from), failed.candidate
        plan = condition_plan(self.condition, failed.contributor_caps, dropped)
        if plan is None:
            self._log(state, row, "condition merge", f"skipped: rule {self.condition} leaves nothing to condition on "
                                                     f"(contributors {failed.contributor_caps or '-'}, dropped "
                                                     f"{''.join(dropped) or '-'})")
            return
        caps, side = plan
        qs = [(q.question, q.capability.value if q.capability else None) for c in state.splits["train"]
              for q in c.questions]
        try:
            reader = QuestionReader.train([q for q, _ in qs], [lab for _, lab in qs], caps)
            source = condition_merge(state.source_of(base.id), state.source_of(failed.candidate), reader, side,
                                     base_id=base.id, merged_id=failed.candidate)
        except MergeError as e:
            self._log(state, row, "condition merge", f"no: condition merge failed: {e}")
            return
        row.condition = {"rule": self.condition, "capabilities": caps, "on_match": side, "words": len(reader.words),
                            "train_accuracy": reader.train_accuracy}
        desc = (f"condition merge of {failed.candidate} onto {base.id}: questions that read as {caps} "
                f"({reader.train_accuracy:.3f} of train read right) get the {side} side's retrieval")
        self._evaluate(state, steps, round_no, row, source, desc, desc, [arch.get(failed.candidate)])

    def _judge(self, state, row: IntegrationRecord, cand: Candidate, contributors: list[Candidate],
               supplied: dict | None = None, parent: Candidate | None = None, proposal: str = "") -> None:
        """Apply :func:`integration_verdict` to ``cand`` against the anchor and book the attempt (a
        candidate of this round, made from ``parent`` (default the anchor), via ``record_round``; a
        reused program with ``proposal``). On failure record the blamed specialist; with
        ``supplied`` (specialist id → element keys) the retry leaves out only its worst lineage
        step's elements (:func:`blame_elements`)."""
        base = state.archive.get(row.anchor)
        if cand.status != "evaluated":
            ok, reason, drops = False, cand.reason, {}
        else:
            ok, reason, drops = integration_verdict(cand.valid.overall, cand.valid.by_capability, base.valid.overall,
                                                    base.valid.by_capability, self.delta)
        row.drops, row.integrated = drops, ok
        if ok:
            if "integrated" not in cand.roles:
                cand.roles.append("integrated")
        else:
            row.blamed = blame(contributors, drops, self.delta)
            if supplied and row.blamed in supplied:
                arch, sid = state.archive, row.blamed
                hit = blame_elements(arch, state.source_of, sid, common_ancestor(arch, sid, base.id),
                                     set(supplied[sid]), worst_drop(drops, self.delta))
                if hit is not None:
                    row.blamed_step, row.left_out = hit[0], [[sid, k] for k in hit[1]]
                    reason += f"; the retry leaves out {sid}'s {', '.join(hit[1])} (from step {hit[0]})"
        accepted = "integrated: the final program" if ok else ""
        if cand.stage == "integrate" and cand.round == row.round:
            cand.reason = "" if ok else (cand.reason or reason)
            state.record_round(row.round, "integrate", None, parent or base, cand, accepted, integration=row)
            return
        self._log(state, row, proposal, accepted or f"no: {reason}")

    def material(self, state, steps, specs, caps_of, paired,
                 failed: IntegrationRecord | None) -> tuple[str, list[str], list[str]]:
        """(integration text, compact traces, their task ids) for an LLM attempt."""
        base = self.anchor(state)
        base_src = state.source_of(base.id)
        parts = [f"Base program: {base.id} (valid overall {base.valid.overall:.3f}). Merge the useful changes of "
                 "the specialists below into ONE program that keeps every capability at least as good as the base "
                 f"(tolerance {self.delta:g}) and beats the base overall."]
        for s in specs:
            diff = unified_diff(base_src, state.source_of(s.id), f"base {base.id}", f"specialist {s.id}")
            sc = ", ".join(f"{c} {v:.3f} (base {base.valid.by_capability.get(c, 0.0):.3f})"
                           for c, v in s.valid.by_capability.items())
            parts.append(f"## Specialist {s.id} for {caps_of[s.id]}: valid {sc}\n```diff\n{diff}```")
        cases, ids = [], []
        for cap, p in paired.items():
            progs = [("base", base.id), (f"specialist {cap}", p["specialist"])]
            if failed:
                progs.append(("failed merge", failed.candidate))
            parts.append(f"Paired differential case for {cap}: {p['task']} (specialist − base on train: "
                         f"{p['gap']:+.3f})")
            for label, cid in progs:
                text = steps.case_texts(state.source_of(cid), [p["task"]])[0]
                cases.append(f"### {cap} case {p['task']}: trace of {label} {cid}\n{text}")
                ids.append(p["task"])
        if failed:
            parts.append(f"## The previous merge {failed.candidate} was not accepted: {failed.accepted}\n"
                         "Its implementation is the program above; fix it with edit blocks.")
        return "\n\n".join(parts), cases, ids

    def _coder_attempt(self, state, steps, round_no, row, specs, caps_of, paired, rows) -> None:
        arch = state.archive
        base = arch.get(row.anchor)
        failed = next((r for r in reversed(rows) if self.evaluated(state, r) and not r.integrated), None)
        parent = arch.get(failed.candidate) if failed else base
        text, cases, ids = self.material(state, steps, specs, caps_of, paired, failed)
        diag = state.diagnostics.get(parent.id, {})
        ancestors, failed_attempts = state.lineage(parent, None, "integrate")
        inp = ProposalInput(state.source_of(parent.id), parent.id, "integrate", None, diag, cases, ids, ancestors,
                            failed_attempts, frozenset(arch.keys()),
                            extra={"round": round_no, "integration": text,
                                   "goal": "Integrate the capability specialists into the base program (trace-guided "
                                           "integration): one program, better overall, no capability worse."})
        cand = steps.attempt(round_no, "integrate", parent, None, inp, self._cid(round_no))
        row.attempt, row.candidate = "coder", cand.id
        row.merged_from = [f"{s.id} ({caps_of[s.id]})" for s in specs]
        self._judge(state, row, cand, specs, parent=parent)
