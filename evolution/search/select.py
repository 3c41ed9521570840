"""Selection policies of the loop (target, parent, cases, acceptance; the ablations' alternatives
are bundled in :mod:`memgym.evolution.search.strategies`).

Source: docs/design.md § "Capability-driven evolution", step 2 (PrisMem Algorithm 1):

- target c maximising  (err_c + max_{c' ≠ c} pressure(c→c')) / (1 + n_c), with
  err_c = 1 − s_c, s_c = the valid score on c of c's specialist;
  pressure(c→c') = max(0, F − S): F = share of the base program's FAILED c'-primary valid
  tasks that list c as a secondary label, S = share of ALL c'-primary valid tasks that do;
  n_c = times c was chosen before. Only capabilities with valid tasks compete; ties go to
  the earlier letter of F, T, P, M, A.
- parent = c's specialist.
- cases: up to 5 train tasks with primary c and the parent's score ≤ 0.8, ranked by
  w = (1 + g) / ((1 + u) · (1 + v)), g = the largest amount by which any archived program
  beat the parent on the task (a regression witness has g > 0), u = times the task was shown,
  v = times its secondary-label combination was shown; ties: lower parent score, then task
  order.

A task "fails" when its score is ≤ :data:`FAIL_THRESHOLD`.
"""
from __future__ import annotations

from dataclasses import dataclass

from memgym.evolution.search.archive import CAPABILITIES, Archive, Candidate

FAIL_THRESHOLD = 0.8


@dataclass(frozen=True)
class TaskInfo:
    """A task's labels (never shown to programs): ``id`` ``"<conversation>/<question id>"``,
    ``split`` (train | valid | test), ``primary`` letter (None = unlabelled), ``secondary``
    letters."""

    id: str
    split: str
    primary: str | None
    secondary: tuple[str, ...] = ()

    @property
    def combo(self) -> str:
        """The secondary-label combination as sorted letters ("" = none)."""
        return "".join(sorted(self.secondary))


def pressure(cap: str, other: str, tasks: list[TaskInfo], scores: dict[str, float]) -> float:
    """pressure(cap → other) on ``tasks`` (one split) with the base's per-task ``scores``."""
    prim = [t for t in tasks if t.primary == other]
    if not prim:
        return 0.0
    failed = [t for t in prim if scores.get(t.id, 0.0) <= FAIL_THRESHOLD]
    share_all = sum(cap in t.secondary for t in prim) / len(prim)
    share_failed = sum(cap in t.secondary for t in failed) / len(failed) if failed else 0.0
    return max(0.0, share_failed - share_all)


def target_scores(archive: Archive, valid_tasks: list[TaskInfo]) -> dict[str, float]:
    """The DESIGN formula's value for every capability with valid tasks (see module doc)."""
    present = [c for c in CAPABILITIES if any(t.primary == c for t in valid_tasks)]
    base_scores = archive.get(archive.base).valid.tasks
    out = {}
    for c in present:
        s_c = archive.specialist(c).valid.by_capability.get(c, 0.0)
        push = max([pressure(c, o, valid_tasks, base_scores) for o in present if o != c], default=0.0)
        out[c] = ((1.0 - s_c) + push) / (1 + archive.selections.get(c, 0))
    return out


class CapabilityAcceptance:
    """docs/design.md § "The loop": in cold start a child whose valid overall beats the base's becomes the base;
    in every stage a child becomes the specialist of each capability whose valid score it
    beats strictly (:meth:`Archive.promote`)."""

    name = "capability"

    def accept(self, archive, cand, stage, parent):
        if cand.status != "evaluated":
            return ""
        took = []
        if stage == "cold" and cand.valid.overall > archive.get(archive.base).valid.overall:
            archive.base = cand.id
            cand.roles.append("base")
            took.append("base")
        took += [f"specialist {c}" for c in archive.promote(cand, list(archive.specialists))]
        return ", ".join(took)


class DependencyAwareTarget:
    """The DESIGN formula (:func:`target_scores`); ties → earlier capability letter."""

    name = "dependency_aware"

    def choose(self, archive, valid_tasks, round_no, rng):
        scores = target_scores(archive, valid_tasks)
        if not scores:
            raise ValueError("no capability has valid tasks: cannot choose a target")
        return max(scores, key=lambda c: (scores[c], -CAPABILITIES.index(c)))


class RoundRobinTarget:
    """Ablation ``round_robin``: the capabilities with valid tasks in turn, by round number."""

    name = "round_robin"

    def choose(self, archive, valid_tasks, round_no, rng):
        present = [c for c in CAPABILITIES if any(t.primary == c for t in valid_tasks)]
        return present[sum(archive.selections.values()) % len(present)]


class SpecialistParent:
    """Parent = the target's specialist (the base when target is None); :meth:`fallbacks`: every
    other evaluated program, best valid overall first (ties: the later one)."""

    name = "specialist"

    def choose(self, archive, target):
        return archive.get(archive.base) if target is None else archive.specialist(target)

    def fallbacks(self, archive, target) -> list[Candidate]:
        if target is None:
            return []
        first = self.choose(archive, target).id
        order = {cid: i for i, cid in enumerate(archive.candidates)}
        rest = [c for c in archive.evaluated() if c.id != first]
        return sorted(rest, key=lambda c: (c.valid.overall, order[c.id]), reverse=True)


def regression_gap(archive: Archive, parent: Candidate, task_id: str) -> float:
    """g: how much better than ``parent`` any evaluated program scored on the train task (≥ 0)."""
    mine = parent.train.tasks.get(task_id, 0.0)
    best = max((c.train.tasks.get(task_id, 0.0) for c in archive.evaluated()), default=mine)
    return max(0.0, best - mine)


def case_weight(archive: Archive, parent: Candidate, task: TaskInfo) -> float:
    """w = (1 + g) / ((1 + u) · (1 + v)) of the module doc."""
    g = regression_gap(archive, parent, task.id)
    u = archive.case_usage.get(task.id, 0)
    v = archive.combo_usage.get(task.combo, 0)
    return (1.0 + g) / ((1.0 + u) * (1.0 + v))


class HistoryGuidedCases:
    """The DESIGN rule for refinement (target given): failed primary-c train tasks ranked by
    :func:`case_weight`. Without a target (cold start): failed train tasks spread over the
    capabilities round-robin (F, T, P, M, A order), each capability's lowest scores first."""

    name = "history_guided"

    def choose(self, archive, parent, target, train_tasks, k, rng):
        scores = parent.train.tasks
        order = {t.id: i for i, t in enumerate(train_tasks)}
        failed = [t for t in train_tasks if scores.get(t.id, 0.0) <= FAIL_THRESHOLD]
        if target is None:
            queues = {c: sorted([t for t in failed if t.primary == c], key=lambda t: (scores.get(t.id, 0.0),
                                                                                      order[t.id]))
                      for c in CAPABILITIES}
            out = []
            while len(out) < k and any(queues.values()):
                for c in CAPABILITIES:
                    if queues[c] and len(out) < k:
                        out.append(queues[c].pop(0).id)
            return out
        pool = [t for t in failed if t.primary == target]
        pool.sort(key=lambda t: (-case_weight(archive, parent, t), scores.get(t.id, 0.0), order[t.id]))
        return [t.id for t in pool[:k]]


class RandomCases:
    """Ablation ``random_cases``: ``k`` train tasks drawn uniformly (seeded), any score."""

    name = "random_cases"

    def choose(self, archive, parent, target, train_tasks, k, rng):
        ids = [t.id for t in train_tasks]
        return rng.sample(ids, min(k, len(ids)))


def record_cases(archive: Archive, case_ids: list[str], tasks: dict[str, TaskInfo]) -> None:
    """Count the shown cases in the archive's usage tables (u and v of the weight)."""
    for cid in case_ids:
        archive.case_usage[cid] = archive.case_usage.get(cid, 0) + 1
        combo = tasks[cid].combo
        archive.combo_usage[combo] = archive.combo_usage.get(combo, 0) + 1


def freeze_choice(archive, accepted_merges=()) -> dict:
    """Which program is frozen and run on test (PrisMem: "the best-performing program is frozen
    for evaluation on S_test"): the best valid overall among the base, the specialists and
    ``accepted_merges`` (ties: the later one). Returns ``{"frozen", "runner_up", "pool": [{"id",
    "roles", "valid"}] (best first), "why"}``. Raises ValueError when no program is evaluated."""
    order = {cid: i for i, cid in enumerate(archive.candidates)}
    roles: dict[str, list[str]] = {}
    if archive.base is not None:
        roles.setdefault(archive.base, []).append("base")
    caps_of: dict[str, str] = {}
    for cap in CAPABILITIES:
        sid = archive.specialists.get(cap)
        if sid is not None:
            roles.setdefault(sid, [])
            caps_of[sid] = caps_of.get(sid, "") + cap
    for sid, caps in caps_of.items():
        roles[sid].append(f"specialist {caps}")
    for mid in accepted_merges:
        roles.setdefault(mid, []).append("merge")
    pool = [archive.get(cid) for cid in roles if archive.get(cid).valid is not None]
    if not pool:
        raise ValueError("no evaluated program among the base, the specialists and the accepted merges")
    pool.sort(key=lambda c: (c.valid.overall, order[c.id]), reverse=True)
    best, second = pool[0], (pool[1] if len(pool) > 1 else None)
    why = (f"{best.id} ({', '.join(roles[best.id])}) has the best valid overall {best.valid.overall:.4f} among "
           f"{len(pool)} programs (base, specialists, accepted merges)")
    if second is not None:
        tie = abs(second.valid.overall - best.valid.overall) <= 1e-12
        why += (f"; runner-up {second.id} ({', '.join(roles[second.id])}) {second.valid.overall:.4f}"
                + (" (a tie: the later program is frozen)" if tie else ""))
    return {"frozen": best.id, "runner_up": second.id if second else None, "why": why,
            "pool": [{"id": c.id, "roles": roles[c.id], "valid": c.valid.overall} for c in pool]}
