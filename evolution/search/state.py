"""The state of one evolution run (the GEPA ``GEPAState`` split: the engine in
:mod:`evolution.search.loop` changes it, the integrator and the reporter read and book on it).

:class:`EvolutionState` holds what ``--resume`` must restore and what the reports read: the
recipe (``cfg``), the run directory (``dir``), the loaded splits and their tasks, the
:class:`~evolution.search.archive.Archive`, the :class:`~evolution.search.ledger.Ledger`, the
history rows, the RNG, the next round, the wall time spent and why the run stopped.
:meth:`EvolutionState.save` writes ``state.json`` atomically; :meth:`EvolutionState.load`
restores it (a damaged file or another recipe: :class:`~evolution.search.rundir.RunStateError`).
"""
from __future__ import annotations

import random
import time

from evolution.search.archive import Archive, Candidate
from evolution.search.config import EvolveConfig
from evolution.search.ledger import Ledger, label_usage
from evolution.search.proposers.base import LineageEntry
from evolution.search.rundir import (RunDir, RunStateError, atomic_write_json, check_recipe, check_state, read_json,
                                     recipe_fields)
from evolution.search.select import TaskInfo, freeze_choice


def rng_to_json(state) -> list:
    """``random.Random.getstate()`` as JSON (a list)."""
    return [state[0], list(state[1]), state[2]]


def rng_from_json(v) -> tuple:
    """The inverse of :func:`rng_to_json`."""
    return (v[0], tuple(v[1]), v[2])


def load_splits(cfg: EvolveConfig) -> dict:
    """``{"train"|"valid"|"test": [Conversation]}`` of the recipe (labels applied to train and
    valid when ``cfg.labels`` is not ``native``)."""
    from data_synth.datasets import load_conversations

    out = {}
    for split in ("train", "valid", "test"):
        ids = getattr(cfg, split)
        if not ids:
            out[split] = []
            continue
        convs = load_conversations(cfg.dataset, cfg.data_path(split), ids=list(ids), n_sessions=cfg.n_sessions,
                                   max_questions=cfg.max_questions, beam_truncated=not cfg.beam_full_chat,
                                   beam_strip_markers=not cfg.beam_keep_markers)
        if cfg.labels != "native" and split != "test":
            from data_synth.annotate import apply_labels, load_labels
            convs = apply_labels(convs, load_labels(cfg.labels))
        out[split] = convs
    return out


class EvolutionState:
    """Archive, ledger, history, RNG and run directory of one run in ``cfg.out``."""

    def __init__(self, cfg: EvolveConfig):
        self.cfg = cfg
        self.dir = RunDir(cfg.out)
        self.dir.root.mkdir(parents=True, exist_ok=True)
        self.splits = load_splits(cfg)
        infos = [TaskInfo(f"{c.id}/{q.id}", split, q.capability.value if q.capability else None,
                          tuple(x.value for x in q.secondary))
                 for split, convs in self.splits.items() for c in convs for q in c.questions]
        self.tasks = {t.id: t for t in infos}
        self.archive = Archive()
        self.ledger = Ledger(budgets=cfg.budgets())
        self.ledger.add_usage(0, label_usage(cfg.labels, self.splits))  # what the labels cost (annotate)
        self.history: list[dict] = []
        self.rng = random.Random(cfg.seed)
        self.next_round = 1
        self.elapsed_s = 0.0
        self.stopped: str | None = None
        self._t0 = time.time()

    def split_tasks(self, split: str) -> list[TaskInfo]:
        return [t for t in self.tasks.values() if t.split == split]

    def source_of(self, cid: str) -> str:
        """The program text of archived candidate ``cid``."""
        return (self.dir.root / self.archive.get(cid).program).read_text(encoding="utf-8")

    # ------------------------------------------------------------------ state.json

    def save(self) -> None:
        """Write ``state.json`` atomically."""
        now = time.time()
        self.elapsed_s += now - self._t0
        self._t0 = now
        atomic_write_json(self.dir.state, {
            "archive": self.archive.to_json(), "ledger": self.ledger.to_json(), "history": self.history,
            "rng": rng_to_json(self.rng.getstate()), "next_round": self.next_round, "elapsed_s": self.elapsed_s,
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
            self.rng.setstate(rng_from_json(st["rng"]))
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RunStateError(f"{self.dir.state}: damaged run state: {type(e).__name__}: {e}") from None
        self.ledger.budgets = self.cfg.budgets()
        self.history = st["history"]
        self.next_round = st["next_round"]
        self.elapsed_s = st["elapsed_s"]
        self.stopped = st.get("stopped")
        self._t0 = time.time()
        return True

    # ------------------------------------------------------------------ reading the archive

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

    # ------------------------------------------------------------------ booking

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
