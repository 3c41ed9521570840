"""The state of one evolution run (GEPA's ``GEPAState`` split): recipe, run dir, splits, archive,
ledger, history, RNG, next round, wall time, stop reason; in memory also program sources,
diagnostics and this process's journal records. :meth:`EvolutionState.save` writes ``state.json``
atomically; :meth:`EvolutionState.load` restores it (:class:`RunStateError` when damaged).
"""
from __future__ import annotations

import random
import time

from memgym.evolution.search.archive import Archive, Candidate, program_key
from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.journal import (HistoryRow, IntegrationAttempt, OutcomeRecord, load_record, record_path,
                                      rng_from_json, rng_to_json)
from memgym.evolution.search.ledger import Ledger, label_usage
from memgym.evolution.search.proposers.base import LineageEntry
from memgym.evolution.search.rundir import (RunDir, RunStateError, atomic_write_json, check_recipe, check_state, read_json,
                                     recipe_fields)
from memgym.evolution.search.select import TaskInfo, freeze_choice


def load_splits(cfg: EvolveConfig) -> dict:
    """``{"train"|"valid"|"test": [Conversation]}`` of the recipe (labels applied to train and
    valid when ``cfg.labels`` is not ``native``)."""
    out = {}
    for split in ("train", "valid", "test"):
        convs = cfg.load_split(split)
        if getattr(cfg, split) and cfg.labels != "native" and split != "test":
            from memgym.data_synth.annotate import apply_labels, load_labels
            convs = apply_labels(convs, load_labels(cfg.labels))
        out[split] = convs
    return out


class EvolutionState:
    """Archive, ledger, history, RNG and run directory of one run in ``cfg.out``."""

    def __init__(self, cfg: EvolveConfig, callbacks=()):
        self.cfg = cfg
        self.callbacks = list(callbacks)
        self.dir = RunDir(cfg.out)
        self.dir.root.mkdir(parents=True, exist_ok=True)
        self.splits = load_splits(cfg)
        infos = [TaskInfo(f"{c.id}/{q.id}", split, q.capability.value if q.capability else None,
                          tuple(x.value for x in q.secondary))
                 for split, convs in self.splits.items() for c in convs for q in c.questions]
        self.tasks = {t.id: t for t in infos}
        self.archive = Archive()
        self.ledger = Ledger(budgets=cfg.role_budgets())
        self.ledger.add_usage(0, label_usage(cfg.labels, self.splits))  # what the labels cost (annotate)
        self.history: list[HistoryRow] = []
        self.rng = random.Random(cfg.seed)
        self.next_round = 1
        self.elapsed_s = 0.0
        self.stopped: str | None = None
        self.sources: dict[str, str] = {}
        self.diagnostics: dict[str, dict] = {}
        self.journal: list = []
        self._t0 = time.time()

    def emit(self, record) -> None:
        """Append a journal record and send it to every callback's ``on_record``."""
        self.journal.append(record)
        self.notify("on_record", record)

    def notify(self, event: str, *args) -> None:
        """Call ``event(self, *args)`` on every callback that has it, in order."""
        for cb in self.callbacks:
            fn = getattr(cb, event, None)
            if fn is not None:
                fn(self, *args)

    def split_tasks(self, split: str) -> list[TaskInfo]:
        return [t for t in self.tasks.values() if t.split == split]

    def source_of(self, cid: str) -> str:
        """The program text of archived candidate ``cid`` (KeyError when it has none)."""
        self.archive.get(cid)
        return self.sources[cid]

    def tick(self) -> None:
        """Bring the wall time spent (``elapsed_s``) up to date."""
        now = time.time()
        self.elapsed_s += now - self._t0
        self._t0 = now

    def save(self) -> None:
        """Write ``state.json`` atomically (the wall time spent is brought up to date)."""
        self.tick()
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
        self.ledger.budgets = self.cfg.role_budgets()
        self.history = st["history"]
        self.next_round = st["next_round"]
        self.elapsed_s = st["elapsed_s"]
        self.stopped = st.get("stopped")
        self._replay_journal()
        self._t0 = time.time()
        return True

    def _replay_journal(self) -> None:
        """The sources (``program.py``, checked against the archived program key) and
        diagnostics (``eval`` records) of the restored archive's candidates; a missing, unreadable
        or changed file is a :class:`RunStateError` naming it."""
        for c in self.archive.candidates.values():
            if c.program:
                path = self.dir.root / c.program
                try:
                    source = path.read_text(encoding="utf-8")
                except (OSError, UnicodeDecodeError) as e:
                    raise RunStateError(f"{path}: the program of archived candidate {c.id} cannot be read: "
                                        f"{getattr(e, 'strerror', None) or e}") from None
                if c.key is not None:
                    try:
                        key = program_key(source)
                    except SyntaxError as e:
                        key = f"a syntax error at line {e.lineno}"
                    if key != c.key:
                        raise RunStateError(f"{path}: the program of archived candidate {c.id} was changed "
                                            f"(program key {c.key} in {self.dir.state.name}, {key} on disk)")
                self.sources[c.id] = source
            if c.status == "evaluated":
                ev = load_record(self.dir.root, c.id, "eval")
                if ev is None:
                    raise RunStateError(f"{record_path(self.dir.root, c.id, 'eval')}: missing: the archive holds "
                                        f"{c.id} as evaluated and the run needs its diagnostics")
                self.diagnostics[c.id] = ev.diagnostics

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
        """:func:`memgym.evolution.search.select.freeze_choice` over the base, every specialist and
        every accepted merge: ``{"frozen", "runner_up", "pool", "why"}``."""
        return freeze_choice(self.archive, self.accepted_merges())

    def final_program(self) -> str:
        """The frozen program's id: the best valid overall among the base, every specialist
        and every accepted merge (ties: the later one), :meth:`freeze`."""
        return self.freeze()["frozen"]

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
        self.emit(OutcomeRecord(cand.id, round_no, cand.status, cand.reason, accepted, list(cand.roles),
                                cand.valid.scores() if cand.valid else None,
                                cand.train.scores() if cand.train else None))
        self.history.append(HistoryRow(
            round=round_no, stage=stage, target=target, parent=parent.id, candidate=cand.id,
            proposal=cand.description, status=cand.status,
            verdict="ok" if cand.validation and cand.validation["ok"] else
            (f"level {cand.validation['level']}" if cand.validation else "-"),
            accepted=accepted or f"no: {cand.reason}", valid=cand.valid.scores() if cand.valid else None,
            specialists={c: self.archive.specialist(c).valid.by_capability.get(c) for c in self.archive.specialists},
            base=self.archive.base, base_overall=self.archive.get(self.archive.base).valid.overall,
            tokens=self.ledger.round_tokens(round_no)))

    def log_integration(self, row: HistoryRow) -> None:
        """Book an integration attempt's history row (appended unless it is already the last
        row) and emit it as an :class:`IntegrationAttempt`."""
        if not self.history or self.history[-1] is not row:
            self.history.append(row)
        self.emit(IntegrationAttempt(row["round"], dict(row)))
