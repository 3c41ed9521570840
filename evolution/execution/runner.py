"""The stage-cached memory-program runner: extract → index → plan → retrieve → answer → score.

Source: PrisMem (arXiv 2610.06361), appendices "memory interface"
and "revision-aware execution reuse". Program code runs only inside
:class:`memgym.evolution.execution.sandbox.SandboxedProgram`. Each stage output is cached under the
stage's cumulative component hash and the hash of its actual inputs, so a child re-executes
from its earliest changed stage; reused state is decoded afresh (the built Memory is a
snapshot restored into a new sandbox). ``retrieve`` is assumed a function of (memory, query).
With a scorer that needs no prediction the answer stage is skipped.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed

from tqdm.auto import tqdm

from memgym.evolution.execution.component_diff import component_hashes, diff_components
from memgym.evolution.execution.diagnostics import METRICS, diagnose_run
from memgym.evolution.execution.results import (ConversationTrace, ProgramEvaluation, ProgramRun, ProgramRunError,  # noqa: F401
                                                dump_units)
from memgym.evolution.execution.run_state import RunState
from memgym.evolution.execution.sandbox import SandboxedProgram, SandboxError
from memgym.evolution.execution.settings import RunnerSettings
from memgym.evolution.execution.stage_cache import StageCache, stage_settings
from memgym.llm.runtime import Runtime
from memgym.memory_bank.contract import BackendToolkitHost, ContractError
from memgym.memory_bank.schema import Conversation
from memgym.rewards.scoring.scorers import make_scorer
from memgym.rewards.scoring.summary import QuestionResult, summarise

__all__ = ["ProgramRun", "ProgramRunError", "ProgramRunner", "RunnerSettings", "dump_units", "evaluate_program"]


class ProgramRunner:
    """Runs memory programs over conversations with stage caching; thread-safe across programs.
    ``settings.workers`` conversations run concurrently, one sandbox each; every model call goes
    through :attr:`model_lock`.
    """

    def __init__(self, rt: Runtime, settings: RunnerSettings | None = None, cache: StageCache | None = None,
                 diagnostics: bool | None = None):
        self.rt = rt
        self.settings = settings or RunnerSettings()
        #: also retrieve with each evidence turn as the query (d_idx); default ``settings.diagnostics``
        self.diagnostics = self.settings.diagnostics if diagnostics is None else diagnostics
        self.cache = cache if cache is not None else StageCache()
        self._task = None
        self._scorer = None
        self._keys: dict[str, dict] = {}
        self.model_lock = threading.RLock()
        self._init_lock = threading.Lock()
        self.context_budget = None
        if self.settings.context_tokens is not None:
            from memgym.rewards.scoring.context_budget import ContextBudget
            self.context_budget = ContextBudget(self.settings.context_tokens, self.settings.context_tokenizer)

    # ------------------------------------------------------------------ resources

    @property
    def task(self):
        """The task backend (role ``task``), loaded on first use."""
        with self._init_lock:
            if self._task is None:
                self._task = self.rt.backend(self.settings.task_model, role="task")
            return self._task

    @property
    def scorer(self):
        """The scorer named by the settings (:func:`memgym.rewards.scoring.scorers.make_scorer`), built once."""
        with self._init_lock:
            if self._scorer is None:
                s = self.settings
                judge = self.rt.backend(s.judge_model, role="judge") if s.scorer == "llm" and s.judge_model else None
                self._scorer = make_scorer(s.scorer, judge, judge_constrained=s.judge_constrained,
                                           dataset=s.dataset, judge_protocol=s.judge_protocol)
            return self._scorer

    def stage_settings(self, stage: str) -> dict:
        """The settings part of ``stage``'s cache keys
        (:func:`memgym.evolution.execution.stage_cache.stage_settings`; model identities include
        their dir fingerprints), computed once per stage."""
        with self._init_lock:
            if stage not in self._keys:
                self._keys[stage] = stage_settings(stage, self.settings)
            return self._keys[stage]

    def sandbox(self, source: str, conv_id: str = "") -> SandboxedProgram:
        """A fresh sandbox holding ``source`` (ProgramRunError when it does not load), its toolkit
        served by the run's embedder and task LLM under :attr:`model_lock`.
        """
        host = BackendToolkitHost(lambda: self.task, lambda: self.rt.embedder, lock=self.model_lock)
        try:
            return SandboxedProgram(source, host, self.settings.sandbox,
                                    llm_budget=self.settings.program_llm_calls, filename="<program>")
        except SandboxError as e:
            raise ProgramRunError(f"program failed to load: {e.kind}: {e.reason}", stage="load",
                                  conversation=conv_id) from None

    # ------------------------------------------------------------------ the run

    def run(self, source: str, conversations: list[Conversation], *, parent_source: str | None = None,
            workers: int | None = None, keep_going: bool = False) -> ProgramRun:
        """Evaluate ``source`` on ``conversations`` and return a :class:`ProgramRun` (conversation
        order kept). ``parent_source`` only feeds the reported diff. ``keep_going``: a conversation
        that fails (:class:`ProgramRunError`: its sandbox dies, times out, ...) is recorded in
        ``failed`` and its questions scored 0 with the error, and the others run on. Raises
        :class:`ProgramRunError` (a program that does not load; any failure without ``keep_going``)
        and the backends' errors.
        """
        t0 = time.time()
        try:
            hashes = component_hashes(source)
            diff = diff_components(parent_source, source) if parent_source is not None else None
        except SyntaxError as e:
            raise ProgramRunError(f"syntax error at line {e.lineno}: {e.msg}", stage="load") from None
        state = RunState(self, source, hashes)
        first = self.sandbox(source, conversations[0].id if conversations else "")
        try:
            info = first.info
        except ContractError as e:
            first.close()
            raise ProgramRunError(f"contract (level {e.level}): {e}", stage="load") from None
        n_workers = max(1, min(workers or self.settings.workers, len(conversations) or 1))
        failed: dict[str, str] = {}
        spare = [first]
        spare_lock = threading.Lock()

        def one(conv: Conversation):
            with spare_lock:
                box = spare.pop() if spare else None
            try:
                box = box or self.sandbox(source, conv.id)
                return state.run_conversation(conv, info, box)
            except ProgramRunError as e:
                if not keep_going:
                    raise
                failed[conv.id] = str(e)
                return ([QuestionResult(conv.id, q, q.capability.value if q.capability else None, None, 0.0,
                                        error=f"conversation failed: {e}") for q in conv.questions],
                        ConversationTrace(conv, [], []))
            finally:
                if box is not None:
                    box.close()

        results = [None] * len(conversations)
        bar = tqdm(total=len(conversations), desc="conversations", disable=not self.settings.progress, unit="conv",
                   leave=False)
        try:
            if n_workers == 1:
                for i, conv in enumerate(conversations):
                    results[i] = one(conv)
                    bar.update(1)
            else:
                with ThreadPoolExecutor(max_workers=n_workers, thread_name_prefix="program-run") as pool:
                    futures = {pool.submit(one, conv): i for i, conv in enumerate(conversations)}
                    try:
                        for fut in as_completed(futures):
                            results[futures[fut]] = fut.result()
                            bar.update(1)
                    except BaseException:
                        for f in futures:
                            f.cancel()
                        raise
        finally:
            bar.close()
            for box in spare:
                box.close()
        tasks = [t for r in results for t in r[0]]
        traces = [r[1] for r in results]
        answer_skipped = not self.scorer.needs_prediction
        return ProgramRun(info, hashes, diff, tasks, traces, state.stage_items, state.stage_llm_calls, answer_skipped,
                          state.plan_failures, state.retrieve_errors, state.extraction_stats,
                          round(time.time() - t0, 3), {c.id: failed[c.id] for c in conversations if c.id in failed})


def run_dataset(run: ProgramRun) -> str | None:
    """The dataset a run's questions come from, by their category labels (None if mixed)."""
    from memgym.data_synth.capabilities import BEAM_MAP, LOCOMO_MAP, LONGMEMEVAL_MAP

    cats = {str(t.qa.category) for t in run.tasks}
    for name, table in (("locomo", LOCOMO_MAP), ("longmemeval", LONGMEMEVAL_MAP), ("beam", BEAM_MAP)):
        if cats and cats <= set(table):
            return name
    return None


def evaluate_program(source: str, convs, runner: ProgramRunner, *, parent_source: str | None = None,
                     diagnostics: bool = True, workers: int | None = None,
                     keep_going: bool = False) -> tuple[ProgramEvaluation, ProgramRun]:
    """Run one program and build its :class:`ProgramEvaluation` (no files written, no
    validation). ``model_calls``/``tokens`` are the runtime's per-role counts during this
    call. ``workers``: conversations evaluated concurrently (default: the runner's setting);
    ``keep_going``: see :meth:`ProgramRunner.run` (``failed_conversations``)."""
    from memgym.rewards.scoring.official import judge_stats
    from memgym.rewards.scoring.judge_protocols import protocol_note

    rt, s = runner.rt, runner.settings
    t0 = time.time()
    calls0 = rt.calls_snapshot()
    judged0 = getattr(runner._scorer, "parse_failures", 0)
    run = runner.run(source, convs, parent_source=parent_source, workers=workers, keep_going=keep_going)
    d = None
    if diagnostics:
        with runner.model_lock:
            d = diagnose_run(run, rt.embedder, progress=s.progress)
    per_task = {r["id"]: r for r in d["tasks"]} if d else {}
    for i, q in enumerate(run.tasks):
        q.trace = f"tasks.jsonl:{i + 1}"
        q.metrics = {m: per_task.get(q.key, {}).get(m) for m in METRICS}
    calls = rt.calls_since(calls0)
    ev = ProgramEvaluation(
        ok=True, summary=summarise(s.dataset or run_dataset(run), run.tasks), questions=run.tasks,
        diagnostics={k: v for k, v in d.items() if k != "tasks"} if d else None, stages_run=run.stages_run,
        stages_reused=run.stages_reused, stages_skipped=["answer"] if run.answer_skipped else [],
        stage_items=run.stage_items, stage_llm_calls=run.stage_llm_calls,
        reuse=run.diff.to_dict() if run.diff is not None else None,
        component_hashes={k: v[:12] for k, v in run.hashes.items()}, extraction=run.extraction,
        plan_failures=run.plan_failures, retrieve_errors=run.retrieve_errors,
        empty_answers=sum(1 for t in run.tasks if t.prediction is not None and not t.prediction.strip()),
        judge_unparsable=getattr(runner._scorer, "parse_failures", 0) - judged0,
        judge_note=protocol_note(s.dataset, s.judge_protocol) if s.scorer == "llm" else None,
        judge_protocol=s.judge_protocol, failed_conversations=dict(run.failed),
        judge_calls=judge_stats(runner.scorer) if s.scorer == "llm" else None, model_calls=calls["calls"],
        tokens=calls["tokens"], wall_s=round(time.time() - t0, 2))
    return ev, run
