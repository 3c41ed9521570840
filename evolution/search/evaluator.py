"""Evaluation of programs for the evolution loop: a program on a split, a candidate's train +
valid evaluation (its journal record), the diagnostics table, compact cases, the baselines.
:class:`Evaluator` holds the two runners (with and without diagnostics) over one stage cache and
keeps up to ``keep_runs`` train runs in memory (LRU) for compact cases; a dropped run is rebuilt
from the stage cache (nothing re-run).
"""
from __future__ import annotations

from collections import OrderedDict

from memgym.evolution.execution.runner import evaluate_program
from memgym.evolution.execution.runner import ProgramRunError, ProgramRunner
from memgym.evolution.search.archive import SplitScores
from memgym.evolution.search.budget_cut import evidence_cut
from memgym.evolution.search.cases import case_from_run, render_compact
from memgym.evolution.search.journal import EvaluationRecord
from memgym.evolution.search.ledger import Ledger, usage_from_eval
from memgym.memory_bank.contract import unit_text


def split_scores(ev) -> SplitScores:
    """The :class:`SplitScores` of a :class:`ProgramEvaluation` (mean retrieved characters
    rounded to 0.1, None when no task reports them; its failed conversations)."""
    ret = [t.get("retrieved_chars") for t in ev.tasks if t.get("retrieved_chars") is not None]
    return SplitScores(ev.overall, {k: v["score"] for k, v in ev.by_capability.items() if k != "?"},
                       ev.task_scores(), {str(k): v["score"] for k, v in ev.by_category.items()},
                       round(sum(ret) / len(ret), 1) if ret else None, dict(ev.failed_conversations))


def diag_table(ev, cut: dict | None = None) -> dict:
    """The diagnostics table a proposer sees: per capability and ``overall``: n, score,
    d_ext, d_idx, d_ret, mean unit and retrieved characters, ``budget_cut`` (the share of
    found evidence the context budget cuts off, :func:`memgym.evolution.search.budget_cut.evidence_cut`
    given as ``cut``; None without a budget); ``overall`` also says whether answers were
    generated (``answered``: False when the scorer reads the retrieved text)."""
    d = ev.diagnostics or {}
    dcap = d.get("by_capability", {})
    ret, grounded = {}, {}
    for t in ev.tasks:
        ret.setdefault(t["capability"] or "?", []).append(t["retrieved_chars"])
        g = (t.get("detail") or {}).get("grounded")
        if g is not None:
            grounded.setdefault(t["capability"] or "?", []).append(g)
            grounded.setdefault("overall", []).append(g)
    table = {}
    for cap, v in ev.by_capability.items():
        dc = dcap.get(cap, {})
        table[cap] = {"n": v["n"], "score": v["score"], "d_ext": dc.get("d_ext"), "d_idx": dc.get("d_idx"),
                      "d_ret": dc.get("d_ret"), "unit_chars": d.get("mean_unit_chars"),
                      "retrieved_chars": sum(ret.get(cap, [0])) / max(1, len(ret.get(cap, []))),
                      "budget_cut": ((cut or {}).get(cap) or {}).get("share")}
        if cap in grounded:
            table[cap]["grounded"] = sum(grounded[cap]) / len(grounded[cap])
    o = d.get("overall", {})
    table["overall"] = {"n": ev.n, "score": ev.overall, "d_ext": o.get("d_ext"), "d_idx": o.get("d_idx"),
                        "d_ret": o.get("d_ret"), "unit_chars": d.get("mean_unit_chars"),
                        "retrieved_chars": d.get("mean_retrieved_chars"),
                        "answered": "answer" not in ev.stages_skipped,
                        "budget_cut": ((cut or {}).get("overall") or {}).get("share")}
    if "overall" in grounded:
        g = grounded["overall"]
        table["overall"].update(grounded=sum(g) / len(g), ungrounded=sum(1 for x in g if x == 0))
    return table


def book_final(ledger: Ledger, ev) -> None:
    """Book an evaluation's calls on the ledger's ``final`` row."""
    ledger.add_usage("final", usage_from_eval(ev))


class Evaluator:
    """Runs programs on the loaded ``splits`` (``{"train"|"valid"|"test": [Conversation]}``)."""

    def __init__(self, rt, cfg, cache, splits: dict, *, keep_runs: int = 8):
        self.rt, self.cfg, self.cache, self.splits = rt, cfg, cache, splits
        self.runner_diag = ProgramRunner(rt, cfg, cache, diagnostics=True)
        self.runner = ProgramRunner(rt, cfg, cache, diagnostics=False)
        self.keep_runs = keep_runs
        self.train_runs: OrderedDict[str, object] = OrderedDict()

    def evaluate(self, source: str, split: str, *, parent_source: str | None = None, diagnostics: bool = False,
                 keep_going: bool = False):
        """(:class:`ProgramEvaluation`, ProgramRun) of ``source`` on ``split`` (``keep_going``: a
        failed conversation is reported and scored 0, the others run on)."""
        runner = self.runner_diag if diagnostics else self.runner
        return evaluate_program(source, self.splits[split], runner, parent_source=parent_source,
                                diagnostics=diagnostics, keep_going=keep_going)

    def evaluate_candidate(self, cid: str, round_no: int, source: str, parent_source: str | None) -> EvaluationRecord:
        """Train (with diagnostics) then valid evaluation of candidate ``cid``, as its journal
        record (the run directory's writer stores it as ``candidates/<cid>/eval.json``)."""
        usage = {}
        ev_tr, run_tr = self.evaluate(source, "train", parent_source=parent_source, diagnostics=True)
        self._keep(source, run_tr)
        ev_va, _ = self.evaluate(source, "valid", parent_source=parent_source)
        for ev in (ev_tr, ev_va):
            for role, u in usage_from_eval(ev).items():
                row = usage.setdefault(role, {"calls": 0, "prompt": 0, "completion": 0})
                for k in row:
                    row[k] += u.get(k, 0)
        return EvaluationRecord(cid, round_no, split_scores(ev_tr), split_scores(ev_va),
                                diag_table(ev_tr, evidence_cut(run_tr, self.runner_diag.context_budget)), usage,
                                {"train": ev_tr.stage_items, "valid": ev_va.stage_items}, ev_va.reuse)

    def _keep(self, source: str, run) -> None:
        self.train_runs[source] = run
        self.train_runs.move_to_end(source)
        while len(self.train_runs) > self.keep_runs:
            self.train_runs.popitem(last=False)

    def train_run(self, source: str):
        """The train run of ``source``: the one kept from its evaluation, else rebuilt through
        the stage cache (all stages cached)."""
        run = self.train_runs.get(source)
        if run is None:
            _, run = self.evaluate(source, "train", diagnostics=False)
            self._keep(source, run)
        else:
            self.train_runs.move_to_end(source)
        return run

    def case_texts(self, source: str, task_ids: list[str]) -> list[str]:
        """The compact diagnostic case (docs/design.md § "Compact diagnostic cases", ``cfg.case_budget``) of
        ``source`` on each train task id (``conversation/qa``), in order."""
        run = self.train_run(source)
        traces = {tr.conversation.id: tr for tr in run.traces}
        by_id = {f"{t.conversation}/{t.qa.id}": t for t in run.tasks}
        out = []
        with self.runner.model_lock:
            for tid in task_ids:
                task = by_id[tid]
                mat = case_from_run(task, traces[task.conversation], lambda u: unit_text(u, run.info.unit_fields))
                out.append(render_compact(mat, self.rt.embedder, self.cfg.case_budget)[0])
        return out

    def baselines(self, names, ledger: Ledger) -> dict:
        """``{name: {"valid": SCORES, "test": SCORES or None}}`` of every recipe baseline
        (:data:`memgym.memory_bank.programs.BASELINES`), each run once on valid and, when the run
        has a test split, on test (calls booked on the ledger's ``final`` row). A conversation that
        fails is reported in the scores' ``failed``; a baseline that cannot run at all
        (:class:`ProgramRunError`) gets None scores and ``error``."""
        from memgym.memory_bank.programs import baseline_program_path, read_program_source

        out = {}
        for name in names:
            source = read_program_source(baseline_program_path(name))
            row = {}
            for split in ("valid", "test"):
                if not self.splits[split]:
                    row[split] = None
                    continue
                try:
                    ev, _ = self.evaluate(source, split, keep_going=True)
                except ProgramRunError as e:  # a baseline that cannot run here is reported, not fatal
                    row[split], row["error"] = None, f"{split}: {e}"
                    continue
                row[split] = split_scores(ev).__dict__
                book_final(ledger, ev)
            out[name] = row
        return out
