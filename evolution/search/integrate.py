"""Trace-guided integration (PrisMem stage III): consolidate the capability specialists into one
program.

Source: DESIGN.md § "Capability-driven evolution", step 3, and issue 9 § 1:

- **paired differential case** of capability c (:func:`paired_cases`): the train task with
  primary label c on which c's specialist beats the base by the largest score gap
  (specialist − base; ties: task order). Under the ``random_cases`` ablation it is a train
  task drawn with the run's seeded RNG instead.
- **acceptance** (:func:`integration_verdict`): the merged program's valid overall score beats
  the base's strictly, and no capability's valid score drops by more than δ (recipe ``delta``,
  default 0.02) against the base.
- **the base of a merge** (recipe ``integrate_onto``): ``base`` is PrisMem's (the run's base
  program); ``best`` (default) is the best valid overall among the base and the specialists
  (:meth:`TraceGuidedIntegrator.anchor`): the other specialists are merged onto it and the
  merge is judged against it, so an accepted merge beats every single program the freeze rule
  could pick. When the base scores best, both are the same.
- **attempts** (one per integration round, at most ``rounds_integrate``): the first is the
  offline component-level merge (:func:`evolution.search.merge.component_merge`) of every
  specialist that differs from the base; it is the whole integration of the ``params``
  proposer and the coder's cheap first try. After a failed offline merge the params
  integrator retries without the **blamed** specialist (:func:`blame`): the contributor with
  the lowest valid score on the capability that dropped most (or, when nothing dropped by
  more than δ, the contributor with the lowest valid overall). An LLM proposer (``coder``,
  ``scripted``) instead gets the base (or the last evaluated failed merge: "a failed merge
  goes back with its implementation"), each specialist's component diff against the base,
  the compact traces of the base and the specialist on each paired case, and, for a retry,
  the failed merge's verdict and its traces on those cases.
- Once a merge is accepted it is the run's final program (:meth:`TraceGuidedIntegrator.final`)
  and the remaining integration rounds only record that; without an accepted merge the final
  program is the base.

Every attempt is one history row (stage ``integrate``) with the specialists, the paired cases,
the conflicts the merge settled, the merged program's valid scores per capability, and
accepted or why not; :func:`evolution.search.report.integration_section` renders them for report.md. The integrator
keeps no state of its own: everything is read back from the archive and the history, so a
resumed run continues exactly.
"""
from __future__ import annotations

import difflib
import random
from dataclasses import dataclass
from typing import Callable

from evolution.search.archive import CAPABILITIES, Archive, Candidate, program_key
from evolution.search.merge import Contender, MergeError, component_merge, element_key
from evolution.search.proposers.base import ProposalInput, ProposalResult
from evolution.search.select import TaskInfo

DEFAULT_DELTA = 0.02
_EPS = 1e-9
OFFLINE_PROPOSERS = ("params",)


# ------------------------------------------------------------------ pure rules


def paired_case(archive: Archive, cap: str, train_tasks: list[TaskInfo],
                base_id: str | None = None) -> tuple[str, float] | None:
    """(task id, gap) of ``cap``'s paired differential case, or None when ``cap`` has no
    specialist other than the base or no primary-``cap`` train task. gap = specialist's
    train score − base's (may be ≤ 0 when the specialist won on valid but not on train).
    ``base_id``: the program merged onto (default the archive's base)."""
    base_id = base_id or archive.base
    spec_id = archive.specialists.get(cap)
    if spec_id is None or spec_id == base_id:
        return None
    spec, base = archive.get(spec_id), archive.get(base_id)
    pool = [t for t in train_tasks if t.primary == cap]
    if not pool:
        return None
    gaps = [(spec.train.tasks.get(t.id, 0.0) - base.train.tasks.get(t.id, 0.0), -i, t.id) for i, t in enumerate(pool)]
    g, _, tid = max(gaps)
    return tid, g


def paired_cases(archive: Archive, train_tasks: list[TaskInfo], rng: random.Random | None = None,
                 random_draw: bool = False, only: set | None = None, base_id: str | None = None) -> dict[str, dict]:
    """capability → ``{"task", "gap", "specialist"}`` for every capability whose specialist
    differs from the base (and is in ``only`` when given), in F, T, P, M, A order.
    ``random_draw`` (ablation ``random_cases``): the task is ``rng.choice`` over all train
    tasks (gap still reported)."""
    out = {}
    base = archive.get(base_id or archive.base)
    for cap in CAPABILITIES:
        if only is not None and archive.specialists.get(cap) not in only:
            continue
        hit = paired_case(archive, cap, train_tasks, base.id)
        if hit is None:
            continue
        tid, gap = hit
        spec = archive.specialist(cap)
        if random_draw:
            tid = rng.choice([t.id for t in train_tasks])
            gap = spec.train.tasks.get(tid, 0.0) - base.train.tasks.get(tid, 0.0)
        out[cap] = {"task": tid, "gap": gap, "specialist": spec.id}
    return out


def integration_verdict(merged_overall: float, merged_caps: dict[str, float], base_overall: float,
                        base_caps: dict[str, float], delta: float = DEFAULT_DELTA) -> tuple[bool, str, dict]:
    """(accepted, reason, drops): accepted when ``merged_overall > base_overall`` and no
    capability of the base drops by more than ``delta`` (a drop of exactly δ is allowed; a
    capability missing from the merged scores counts as 0). ``drops``: capability → base −
    merged for every capability that dropped (> 0). ``reason`` is "" when accepted, else the
    first failed condition with numbers."""
    drops = {c: base_caps[c] - merged_caps.get(c, 0.0) for c in base_caps
             if base_caps[c] - merged_caps.get(c, 0.0) > _EPS}
    if not merged_overall > base_overall + _EPS:
        return False, f"valid overall {merged_overall:.4f} does not beat the base's {base_overall:.4f}", drops
    over = {c: d for c, d in drops.items() if d > delta + _EPS}
    if over:
        worst = max(over, key=lambda c: (over[c], -CAPABILITIES.index(c) if c in CAPABILITIES else 0))
        return False, (f"capability {worst} drops {over[worst]:.4f} > delta {delta:g} against the base"
                       + (f" (also {', '.join(sorted(set(over) - {worst}))})" if len(over) > 1 else "")), drops
    return True, "", drops


def blame(contributors: list[Candidate], drops: dict[str, float], delta: float) -> str | None:
    """The specialist an offline retry leaves out (module doc): the contributor with the
    lowest valid score on the capability that dropped most beyond δ, else the one with the
    lowest valid overall. Ties: the later one in ``contributors``. None when empty."""
    if not contributors:
        return None
    over = {c: d for c, d in drops.items() if d > delta + _EPS}
    if over:
        cap = max(over, key=lambda c: (over[c], -CAPABILITIES.index(c) if c in CAPABILITIES else 0))
        return min(reversed(contributors), key=lambda s: s.valid.by_capability.get(cap, 0.0)).id
    return min(reversed(contributors), key=lambda s: s.valid.overall).id


def common_ancestor(archive: Archive, a: str, b: str) -> str:
    """The deepest program in both lineages (the seed at worst)."""
    la = [c.id for c in archive.lineage(a)]
    lb = {c.id for c in archive.lineage(b)}
    return next(cid for cid in reversed(la) if cid in lb)


# ------------------------------------------------------------------ proposers of one attempt


@dataclass
class MergeProposer:
    """Proposes a fixed, precomputed merge (so the loop's attempt path validates, evaluates
    and stores it like any proposal). ``source``: the merged program; ``description``."""

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


# ------------------------------------------------------------------ the integrator


@dataclass(frozen=True)
class RoundSteps:
    """What the engine lends an integrator for one round (the integrator never sees the
    engine): ``attempt(round_no, stage, parent, target, inp, cid, proposer=None) -> Candidate``
    (propose → check → validate → evaluate, :meth:`evolution.search.loop.Evolution.attempt`),
    ``case_texts(source, task_ids) -> [str]`` (compact train cases,
    :meth:`evolution.search.evaluator.Evaluator.case_texts`) and the run proposer's name."""

    attempt: Callable
    case_texts: Callable
    proposer_name: str


class TraceGuidedIntegrator:
    """The loop's integration hook (``run_round(state, steps, round_no, rng)``, ``final(state)``):
    ``state`` is the run's :class:`~evolution.search.state.EvolutionState` (read, and booked on
    through ``record_round``), ``steps`` the engine's :class:`RoundSteps`.

    ``delta``: the acceptance tolerance; ``random_cases``: paired cases drawn at random
    (ablation); ``offline_first``: an LLM proposer's first attempt is the offline merge;
    ``onto``: the program the specialists are merged onto and judged against, ``base`` (the
    base, PrisMem's rule) or ``best`` (the best valid overall among the base and the
    specialists, ties to the later one: a merge is then only accepted when it beats the best
    single program, the one the freeze rule would otherwise pick).
    """

    name = "trace_guided"

    def __init__(self, delta: float = DEFAULT_DELTA, *, random_cases: bool = False, offline_first: bool = True,
                 onto: str = "base"):
        if delta < 0:
            raise ValueError(f"delta must be >= 0, got {delta}")
        if onto not in ("base", "best"):
            raise ValueError(f"onto must be base or best, got {onto!r}")
        self.delta, self.random_cases, self.offline_first, self.onto = delta, random_cases, offline_first, onto

    def anchor(self, state) -> Candidate:
        """The program merged onto (see ``onto``); the same in every integration round, since
        integration changes neither the base nor the specialists."""
        arch = state.archive
        if self.onto == "base":
            return arch.get(arch.base)
        from evolution.search.select import freeze_choice
        return arch.get(freeze_choice(arch, [])["frozen"])

    # -------------------------------------------------------------- state read back

    @staticmethod
    def rows(state) -> list[dict]:
        return [h for h in state.history if h.get("stage") == "integrate"]

    def final(self, state) -> str:
        """The accepted merge's id, else the base's."""
        done = [h for h in self.rows(state) if h.get("integrated")]
        return done[-1]["candidate"] if done else state.archive.base

    # -------------------------------------------------------------- one round

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
        rows = self.rows(state)
        row = {"round": round_no, "stage": "integrate", "target": None, "parent": base.id, "anchor": base.id,
               "candidate": "-",
               "status": "-", "verdict": "-", "valid": None, "integrated": False, "merged_from": [], "paired": {},
               "conflicts": [], "kind": "-"}
        if any(h.get("integrated") for h in rows):
            self._log(state, row, "merge already accepted", "skipped: an earlier integration round was accepted")
            return
        specs = self.specialists(state)
        if not specs:
            onto = "the base" if base.id == arch.base else f"the program merged onto ({base.id})"
            self._log(state, row, "nothing to integrate", f"skipped: every specialist is {onto} or its ancestor")
            return
        caps_of = {s.id: "".join(c for c in CAPABILITIES if arch.specialists.get(c) == s.id) for s in specs}
        merges = [h for h in rows if h.get("kind") == "merge"]
        use_merge = steps.proposer_name in OFFLINE_PROPOSERS or (self.offline_first and not merges)
        include = [s.id for s in specs]
        if use_merge and merges:  # an offline retry leaves out every specialist blamed so far
            include = [i for i in include if i not in {h.get("blamed") for h in merges}]
            if not include or merges[-1].get("blamed") is None:
                self._log(state, row, "no merge left to try", "skipped: every specialist was left out")
                return
        paired = paired_cases(arch, state.split_tasks("train"), rng, self.random_cases, set(include), base.id)
        row["paired"] = paired
        if use_merge:
            self._merge_attempt(state, steps, round_no, row, [arch.get(i) for i in include], caps_of, paired)
        else:
            self._coder_attempt(state, steps, round_no, row, specs, caps_of, paired, rows)

    def _log(self, state, row: dict, proposal: str, accepted: str) -> None:
        row.update({"proposal": proposal, "accepted": accepted, "tokens": state.ledger.round_tokens(row["round"])})
        state.history.append(row)

    def _cid(self, round_no: int) -> str:
        return f"r{round_no:02d}"

    def _merge_attempt(self, state, steps, round_no, row, include: list[Candidate], caps_of, paired) -> None:
        arch = state.archive
        base = arch.get(row["anchor"])
        cases = {p["task"] for p in paired.values()}
        conts = [Contender(s.id, state.source_of(s.id), caps_of[s.id], {t: s.train.tasks.get(t, 0.0) for t in cases})
                 for s in include]
        ancestors = {s.id: state.source_of(common_ancestor(arch, s.id, base.id)) for s in include}
        row.update(kind="merge", merged_from=[f"{s.id} ({caps_of[s.id]})" for s in include])
        try:
            res = component_merge(Contender(base.id, state.source_of(base.id)), conts, ancestors,
                                  {c: p["task"] for c, p in paired.items()})
        except MergeError as e:  # a program that cannot be split is left out next time
            # (the program merged onto itself cannot be left out: no retry, blamed None)
            row["blamed"] = None if str(e).startswith(f"{base.id}:") else \
                next((s.id for s in include if str(e).startswith(f"{s.id}:")), include[-1].id)
            self._log(state, row, "component merge", f"no: merge failed: {e}")
            return
        row["conflicts"] = [c.to_dict() for c in res.conflicts]
        row["components"] = res.components
        desc = "component merge of " + ", ".join(f"{s.id} ({caps_of[s.id]})" for s in include) + \
            (f" onto {base.id}" if base.id != arch.base else "")
        key, ekey = program_key(res.source), element_key(res.source)
        same = next((c for c in arch.candidates.values() if c.status == "evaluated" and
                     (c.key == key or element_key(state.source_of(c.id)) == ekey)), None)
        if same is not None:  # the merge is an archived program, up to statement order: reuse its scores
            row.update(candidate=same.id, status="evaluated", verdict="ok", valid=same.valid.scores(),
                       proposal=desc + f" = archived {same.id} (scores reused)")
            self._judge(state, row, same, [s for s in include if s.id in res.contributors])
            return
        detail = "\n".join([desc, "components: " + str(res.components),
                            "conflicts: " + str([c.to_dict() for c in res.conflicts])])
        inp = ProposalInput(state.source_of(base.id), base.id, "integrate", None, {}, [], [], [], [],
                            frozenset(arch.keys()), extra={"round": round_no})
        cand = steps.attempt(round_no, "integrate", base, None, inp, self._cid(round_no),
                           proposer=MergeProposer(res.source, desc, detail))
        row.update(candidate=cand.id, proposal=desc, status=cand.status,
                   verdict="ok" if cand.validation and cand.validation["ok"] else
                   (f"level {cand.validation['level']}" if cand.validation else "-"),
                   valid=cand.valid.scores() if cand.valid else None)
        self._judge(state, row, cand, [s for s in include if s.id in res.contributors])

    def _judge(self, state, row, cand: Candidate, contributors: list[Candidate]) -> None:
        """Apply the acceptance rule to ``cand`` and book the attempt: a candidate made in this
        round through :meth:`EvolutionState.record_round` (outcome.json, failed attempts, history),
        a reused archived program as a plain history row. Judged against the anchor."""
        base = state.archive.get(row.get("anchor") or state.archive.base)
        if cand.status != "evaluated":
            ok, reason, drops = False, cand.reason, {}
        else:
            ok, reason, drops = integration_verdict(cand.valid.overall, cand.valid.by_capability, base.valid.overall,
                                                    base.valid.by_capability, self.delta)
        row["drops"], row["integrated"] = drops, ok
        if ok:
            if "integrated" not in cand.roles:
                cand.roles.append("integrated")
        else:
            row["blamed"] = blame(contributors, drops, self.delta)
        accepted = "integrated: the final program" if ok else ""
        if cand.stage == "integrate" and cand.round == row["round"]:
            cand.reason = "" if ok else (cand.reason or reason)
            state.record_round(row["round"], "integrate", None, state.archive.get(row["parent"]), cand, accepted)
            extra = {k: v for k, v in row.items() if k not in state.history[-1] or k in ("kind", "integrated")}
            state.history[-1].update(extra)
            return
        self._log(state, row, row.get("proposal", ""), accepted or f"no: {reason}")

    # -------------------------------------------------------------- LLM attempt

    def material(self, state, steps, specs, caps_of, paired, failed: dict | None) -> tuple[str, list[str], list[str]]:
        """(integration text, compact traces, their task ids) for an LLM attempt."""
        arch = state.archive
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
                progs.append(("failed merge", failed["candidate"]))
            parts.append(f"Paired differential case for {cap}: {p['task']} (specialist − base on train: "
                         f"{p['gap']:+.3f})")
            for label, cid in progs:
                text = steps.case_texts(state.source_of(cid), [p["task"]])[0]
                cases.append(f"### {cap} case {p['task']}: trace of {label} {cid}\n{text}")
                ids.append(p["task"])
        if failed:
            parts.append(f"## The previous merge {failed['candidate']} was not accepted: {failed['accepted']}\n"
                         "Its implementation is the program above; fix it with edit blocks.")
        return "\n\n".join(parts), cases, ids

    def _coder_attempt(self, state, steps, round_no, row, specs, caps_of, paired, rows) -> None:
        arch = state.archive
        base = arch.get(row["anchor"])
        failed = next((h for h in reversed(rows) if h.get("candidate") and h.get("status") == "evaluated"
                       and not h.get("integrated")), None)
        parent = arch.get(failed["candidate"]) if failed else base
        text, cases, ids = self.material(state, steps, specs, caps_of, paired, failed)
        diag = (state.dir.load_step(parent.id, "eval") or {}).get("diagnostics", {})
        ancestors, failed_attempts = state.lineage(parent, None, "integrate")
        inp = ProposalInput(state.source_of(parent.id), parent.id, "integrate", None, diag, cases, ids, ancestors,
                            failed_attempts, frozenset(arch.keys()),
                            extra={"round": round_no, "integration": text,
                                   "goal": "Integrate the capability specialists into the base program (trace-guided "
                                           "integration): one program, better overall, no capability worse."})
        cand = steps.attempt(round_no, "integrate", parent, None, inp, self._cid(round_no))
        row.update(kind="coder", parent=parent.id, candidate=cand.id, proposal=cand.description or "coder merge",
                   merged_from=[f"{s.id} ({caps_of[s.id]})" for s in specs], status=cand.status,
                   verdict="ok" if cand.validation and cand.validation["ok"] else
                   (f"level {cand.validation['level']}" if cand.validation else "-"),
                   valid=cand.valid.scores() if cand.valid else None)
        self._judge(state, row, cand, specs)
