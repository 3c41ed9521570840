"""The state of one evolution run (GEPA's ``GEPAState``): recipe, run dir, splits, archive (with
the integration log), ledger, history (one :class:`RoundRecord` per round), RNG, next round, wall
time, stop reason; in memory also program sources and diagnostics. :meth:`EvolutionState.emit`
writes each journal record as it is made; :meth:`EvolutionState.save` (the engine's checkpoint)
writes ``state.json`` atomically; :meth:`EvolutionState.load` restores it (:class:`RunStateError`
when damaged or of another format).
"""
from __future__ import annotations

import random
import time

from memgym.evolution.search.archive import Archive, Candidate, IntegrationRecord, program_key
from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.journal import (FinalRecord, RoundRecord, final_path, load_scores, record_path,
                                             rng_from_json, rng_to_json)
from memgym.evolution.search.ledger import Ledger, label_usage
from memgym.evolution.search.proposers.base import LineageEntry
from memgym.evolution.search.rundir import (STATE_FORMAT, RunDir, RunStateError, atomic_write_json, atomic_write_text,
                                            check_recipe, check_state, read_json, recipe_fields)
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
    """Archive, ledger, history, RNG and run directory of one run in ``cfg.out``; ``recipe``: the
    recipe as given (``cfg`` is it after the strategy, :meth:`Strategy.run_config`)."""

    def __init__(self, cfg: EvolveConfig, callbacks=(), recipe: EvolveConfig | None = None):
        self.cfg, self.recipe = cfg, recipe or cfg
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
        self.history: list[RoundRecord] = []
        self.rng = random.Random(cfg.seed)
        self.next_round = 1
        self.elapsed_s = 0.0
        self.stopped: str | None = None
        self.sources: dict[str, str] = {}
        self.diagnostics: dict[str, dict] = {}
        self._t0 = time.time()

    def emit(self, record) -> None:
        """Write a journal record (``candidates/<id>/<step>.json``, ``final.json``; with a
        candidate's outcome its ``program.py``, and ``seed.py``), then send it to every callback's
        ``on_record``. An :class:`IntegrationRecord` has no file: it is in the archive."""
        root = self.dir.root
        if isinstance(record, FinalRecord):
            atomic_write_json(final_path(root), record.to_json())
        elif record.step is not None:
            if isinstance(record, RoundRecord) and record.candidate in self.sources:
                atomic_write_text(self.dir.cand(record.candidate) / "program.py", self.sources[record.candidate])
                if record.candidate == "seed":
                    atomic_write_text(root / "seed.py", self.sources["seed"])
            atomic_write_json(record_path(root, record.candidate, record.step), record.to_json())
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

    def write_recipe(self) -> None:
        """Write ``recipe.json`` (the recipe as given; ``--resume`` reads it) unless it exists."""
        if not self.dir.recipe.exists():
            atomic_write_json(self.dir.recipe, recipe_fields(self.recipe, display=True))

    def save(self) -> None:
        """The checkpoint: write ``state.json`` atomically (the wall time spent brought up to
        date). The recipe is stored in the same form as ``recipe.json``, to refuse an edited one."""
        self.tick()
        atomic_write_json(self.dir.state, {
            "format": STATE_FORMAT, "archive": self.archive.to_json(), "ledger": self.ledger.to_json(),
            "history": [r.to_json() for r in self.history], "rng": rng_to_json(self.rng.getstate()),
            "next_round": self.next_round, "elapsed_s": self.elapsed_s, "stopped": self.stopped,
            "recipe": recipe_fields(self.recipe)})

    def load(self) -> bool:
        """Restore ``state.json`` if present (True when restored)."""
        st = read_json(self.dir.state)
        if st is None:
            return False
        check_state(st, self.dir.state)
        check_recipe(st["recipe"], self.recipe, self.dir.recipe, self.dir.state)
        try:
            self.archive = Archive.from_json(st["archive"])
            self.ledger = Ledger.from_json(st["ledger"])
            self.rng.setstate(rng_from_json(st["rng"]))
            self.history = [RoundRecord.from_json(r) for r in st["history"]]
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise RunStateError(f"{self.dir.state}: damaged run state: {type(e).__name__}: {e}") from None
        self.ledger.budgets = self.cfg.role_budgets()
        self.next_round = st["next_round"]
        self.elapsed_s = st["elapsed_s"]
        self.stopped = st.get("stopped")
        self._replay_journal()
        self._t0 = time.time()
        return True

    def _replay_journal(self) -> None:
        """The sources (``program.py``, checked against the archived program key), scores and
        diagnostics (``eval`` records, :func:`load_scores`) of the restored archive's candidates; a
        missing, unreadable or changed file is a :class:`RunStateError` naming it."""
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
        self.diagnostics = load_scores(self.dir.root, self.archive)

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

    def freeze(self) -> dict:
        """:func:`memgym.evolution.search.select.freeze_choice` over the base, every specialist and
        every accepted merge: ``{"frozen", "runner_up", "pool", "why"}``."""
        return freeze_choice(self.archive, [r.candidate for r in self.archive.merges()])

    def record(self, rec: RoundRecord) -> None:
        """Book what a round decided: the history's record, written as the outcome of a candidate
        made in the round."""
        self.history.append(rec)
        if rec.candidate in self.archive.candidates and self.archive.get(rec.candidate).round == rec.round:
            self.emit(rec)

    def record_round(self, round_no: int, stage: str, target: str | None, parent: Candidate, cand: Candidate,
                     accepted: str, fallback_from: str | None = None,
                     integration: IntegrationRecord | None = None) -> None:
        """Book a finished attempt: its reason when not accepted, the target's failed attempts,
        the integration log's ``integration`` (integrators' rounds) and the :class:`RoundRecord`."""
        if not accepted and cand.status == "evaluated":
            cand.reason = cand.reason or ("valid overall did not improve" if stage in ("cold", "integrate", "holistic")
                                          else "no capability's valid score improved")
        if not accepted:
            self.archive.attempts.setdefault(target or stage, []).append(cand.id)
        accepted = accepted or f"no: {cand.reason}"
        if integration is not None:
            integration.accepted = accepted
            self.log_integration(integration)
        self.record(RoundRecord(round_no, stage, target, parent.id, cand.id, cand.description, accepted,
                                self.archive.base, dict(self.archive.specialists), fallback_from))

    def log_integration(self, rec: IntegrationRecord) -> None:
        """Append an integration attempt to the archive's log and tell the callbacks."""
        self.archive.integrations.append(rec)
        self.notify("on_record", rec)
