"""The stage-cached memory-program runner: extract → index → plan → retrieve → answer → score.

Source: PrisMem (``shared/seeds/000_0e559b88b400976a.txt``), appendix "memory interface" and
"revision-aware execution reuse"; DESIGN.md § "Memory programs and capability-driven
evolution". The program's own code (``Memory.index``/``retrieve``) only ever runs inside
:class:`evolution.execution.sandbox.SandboxedProgram`; the host runs the LLM stages.

Caching (:class:`evolution.execution.stages.StageCache`, in memory and on disk): every stage output is
stored under a key made of the stage's cumulative component hash
(:func:`evolution.execution.component_diff.stage_component_hashes`) and the hash of its actual inputs.
A child program therefore re-executes from the earliest stage whose component changed
(shared helpers: from indexing on) and reuses everything before it, given its parent ran
with the same cache and inputs. Reused state is copied: units, plans, retrieved texts and
answers are stored as JSON bytes and decoded afresh; the built Memory is stored as the
sandbox snapshot bytes taken right after indexing and restored into a NEW sandbox child.
``retrieve`` is assumed to be a function of (built memory, query), so its outputs are cached
per query.

Stage items: extract and index count sessions, plan/answer/score count questions, retrieve
counts questions plus the diagnostics' evidence probes. With a scorer that needs no
prediction (answer-recall over the retrieved text) the answer stage is skipped.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from data_synth.extractors import expert_paths, extractor_kind
from evolution.execution.component_diff import STAGES, component_hashes, diff_components, \
    stage_component_hashes
from evolution.execution.extract_stage import ExtractStage
from evolution.execution.results import (ConversationTrace, ProgramRun, ProgramRunError,  # noqa: F401 (re-exported)
                                         TaskResult, dump_units)
from evolution.execution.sandbox import ProgramRaised, SandboxedProgram, SandboxError, SandboxLimits
from evolution.execution.stages import (StageCache, answer_messages, file_sha, model_identity, planning_messages,
                                        stable_hash)
from llm.runtime import Runtime
from llm.base import Completion, GenerationParams, TruncatedOutputError, require_complete
from llm.structured import bounded
from memory_bank.program import (OUT_CHAR_BUDGET, BackendToolkitHost, ContractError, ProgramInfo, SessionInfo,
                                 StructuredOutputError, parse_structured, text_query)
from memory_bank.record_schemas import query_schema
from memory_bank.schema import Conversation, QAItem
from rewards.scoring.answer import clean_answer
from rewards.scoring.judge import ScoreItem
from rewards.scoring.scorers import make_scorer



@dataclass
class RunnerSettings:
    """How the runner executes a program.

    extractor: ``instruction`` (the task LLM with EXTRACTION_INSTRUCTION), ``turns`` (no
    model: every dialogue turn is a unit, :func:`turn_entries`), ``expert:<file or
    conv-NN>[,...]`` (replay), or a trained extractor's backend spec ``hf:<dir>`` /
    ``openai:<url>#<model>``. task_model: backend spec of the task LLM (plan, answer,
    instruction extraction, program toolkit.llm). plan_mode: ``llm`` (the task LLM with
    PLANNING_INSTRUCTION) or ``question`` (no LLM call: the question text goes into the
    Query by :func:`memory_bank.program.text_query`; an offline/ablation setting).
    scorer: ``answer-recall`` | ``f1`` | ``rubric-recall`` (BEAM) | ``llm`` (then ``judge_model``: the
    official judge of ``dataset``, see :func:`rewards.scoring.scorers.make_scorer`). Token budgets are in
    tokens of the respective model. program_llm_calls: toolkit.llm budget per conversation's
    sandbox. diagnostics: also retrieve with each evidence turn as the query (d_idx).
    workers: conversations of one evaluation run concurrently (one sandbox each).
    constrained: decode instruction extraction under the program's MemoryUnit-list schema, plans
    under its Query schema, and a trained extractor's manager outputs under theirs
    (:mod:`memory_bank.record_schemas`, :mod:`memory_bank.action_schemas`); judge_constrained:
    the judge's verdicts under theirs (memgym's own judge only, ``dataset`` None); judge_protocol:
    ``official`` | ``corrected`` (BEAM), :mod:`rewards.scoring.protocols`. constrained_max_chars / constrained_max_items bound every
    string / list of the extraction and plan schemas (:func:`llm.structured.bounded`). All are
    part of the stage-cache keys. context_tokens: the context budget (None = none): each
    retrieved text is cut to this many tokens of ``context_tokenizer`` before the answer and
    score stages (:class:`evolution.execution.context_budget.ContextBudget`), the same for
    every program; the cut text is what the task results and diagnostics report.
    """

    extractor: str = "instruction"
    task_model: str = "hf:smollm2"
    plan_mode: str = "llm"
    scorer: str = "answer-recall"
    judge_model: str | None = None
    dataset: str | None = None
    extract_max_new_tokens: int = 1024
    extractor_max_new_tokens: int = 512
    extractor_context_tokens: int | None = None
    plan_max_new_tokens: int = 96
    answer_max_new_tokens: int = 48
    program_llm_calls: int = 0
    diagnostics: bool = True
    constrained: bool = False
    constrained_max_chars: int | None = None
    constrained_max_items: int | None = None
    judge_constrained: bool = False
    judge_protocol: str = "official"
    sandbox: SandboxLimits = field(default_factory=SandboxLimits)
    progress: bool = False
    workers: int = 1
    context_tokens: int | None = None
    context_tokenizer: str = "smollm2"

    def __post_init__(self):
        if self.plan_mode not in ("llm", "question"):
            raise ValueError(f"plan_mode must be 'llm' or 'question', got {self.plan_mode!r}")
        if self.workers < 1:
            raise ValueError(f"workers must be >= 1, got {self.workers}")
        if self.program_llm_calls < 0:
            raise ValueError(f"program_llm_calls must be >= 0, got {self.program_llm_calls}")
        if self.context_tokens is not None:
            from evolution.execution.context_budget import ContextBudget
            ContextBudget(self.context_tokens, self.context_tokenizer)  # ValueError names the field
        kind = extractor_kind(self.extractor)
        if kind == "extractor":
            from llm.specs import parse_spec
            parse_spec(self.extractor)  # BackendSpecError names the spec

    @property
    def extraction_mode(self) -> str:
        return extractor_kind(self.extractor)


class ProgramRunner:
    """Runs memory programs over conversations with stage caching.

    ``ProgramRunner(rt, settings, cache)``: ``rt`` a :class:`llm.runtime.Runtime` (task
    backend, embedder, per-role call/token ledger); ``cache`` a :class:`StageCache` (default:
    in memory only). One runner may evaluate many programs, also at the same time from
    several threads: everything one evaluation accumulates lives in its own :class:`RunState`,
    the runner only holds shared resources (backends, scorer, cache, model identities).
    ``settings.workers`` conversations of one evaluation run concurrently, each in its own
    sandbox; every model call (task LLM, embedder, judge, extractor) goes through
    :attr:`model_lock`, so backends see one batch at a time.
    """

    def __init__(self, rt: Runtime, settings: RunnerSettings | None = None, cache: StageCache | None = None):
        self.rt = rt
        self.settings = settings or RunnerSettings()
        self.cache = cache if cache is not None else StageCache()
        self._task = None
        self._scorer = None
        self._ids: dict[str, str] = {}
        self.model_lock = threading.RLock()
        self._init_lock = threading.Lock()
        self.context_budget = None
        if self.settings.context_tokens is not None:
            from evolution.execution.context_budget import ContextBudget
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
        """The scorer named by the settings (:func:`rewards.scoring.scorers.make_scorer`), built once."""
        with self._init_lock:
            if self._scorer is None:
                s = self.settings
                judge = self.rt.backend(s.judge_model, role="judge") if s.scorer == "llm" and s.judge_model else None
                self._scorer = make_scorer(s.scorer, judge, judge_constrained=s.judge_constrained,
                                           dataset=s.dataset, judge_protocol=s.judge_protocol)
            return self._scorer

    def identity(self, what: str) -> str:
        """Cache identity of ``task`` | ``extractor`` | ``scorer`` (model dir fingerprints
        included), computed once."""
        with self._init_lock:
            if what not in self._ids:
                self._ids[what] = self._compute_identity(what)
            return self._ids[what]

    def _compute_identity(self, what: str) -> str:
        s = self.settings
        if what == "task":
            return model_identity(s.task_model)
        if what == "extractor":
            if s.extraction_mode == "expert":
                paths = expert_paths(s.extractor)
                return "expert:" + ",".join(file_sha(p) for p in paths)
            if s.extraction_mode == "turns":
                return "turns"
            return model_identity(s.extractor)
        if what == "scorer":
            return (s.scorer + (f"|{model_identity(s.judge_model)}|{s.dataset}|{s.judge_protocol}"
                                if s.scorer == "llm" and s.judge_model else "")
                    + ("|constrained" if s.scorer == "llm" and s.judge_constrained else ""))
        raise KeyError(what)

    def sandbox(self, source: str, conv_id: str = "") -> SandboxedProgram:
        """A fresh sandbox holding ``source`` (ProgramRunError when it does not load). Its
        toolkit host is a :class:`memory_bank.program.BackendToolkitHost` over the run's embedder
        and the task LLM (loaded on the program's first ``toolkit.llm`` call), both used under
        :attr:`model_lock`."""
        host = BackendToolkitHost(lambda: self.task, lambda: self.rt.embedder, lock=self.model_lock)
        try:
            return SandboxedProgram(source, host, self.settings.sandbox,
                                    llm_budget=self.settings.program_llm_calls, filename="<program>")
        except SandboxError as e:
            raise ProgramRunError(f"program failed to load: {e.kind}: {e.reason}", stage="load",
                                  conversation=conv_id) from None

    # ------------------------------------------------------------------ the run

    def run(self, source: str, conversations: list[Conversation], *, parent_source: str | None = None,
            workers: int | None = None) -> ProgramRun:
        """Evaluate ``source`` on ``conversations`` (QA included) and return a :class:`ProgramRun`.

        ``parent_source`` (optional) is only used to report the component diff; reuse itself
        comes from the cache. ``workers`` (default ``settings.workers``): conversations run
        concurrently, one sandbox each; results keep the conversations' order. Raises
        :class:`ProgramRunError` (syntax error, broken contract, sandbox death or timeout,
        extractor output the unit schema cannot hold) and the backends' errors.
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
        spare = [first]
        spare_lock = threading.Lock()

        def one(conv: Conversation):
            with spare_lock:
                box = spare.pop() if spare else None
            box = box or self.sandbox(source, conv.id)
            try:
                return state.run_conversation(conv, info, box)
            finally:
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
                          round(time.time() - t0, 3))


class RunState(ExtractStage):
    """Everything ONE evaluation accumulates (stage hashes of the program, items run/reused per
    stage, LLM calls per stage, plan failures, retrieve errors, extraction statistics), and the
    stage methods that fill it. Shared resources come from :attr:`runner`. Counters are
    updated under :attr:`lock`, so the conversations of one run may execute concurrently."""

    def __init__(self, runner: ProgramRunner, source: str, hashes: dict[str, str]):
        self.runner = runner
        self.settings = runner.settings
        self.cache = runner.cache
        self.rt = runner.rt
        self.source = source
        self.stage_hash = stage_component_hashes(hashes)
        self.stage_items = {s: {"run": 0, "reused": 0} for s in STAGES}
        self.stage_llm_calls = {s: 0 for s in STAGES}
        self.plan_failures = self.retrieve_errors = 0
        self.extraction_stats = {"mode": self.settings.extraction_mode, "sessions": 0, "units": 0, "segments": 0,
                                 "format_failures": 0, "manager_failures": {}}
        self.lock = threading.Lock()

    @property
    def task(self):
        return self.runner.task

    @property
    def scorer(self):
        return self.runner.scorer

    def _identity(self, what: str) -> str:
        return self.runner.identity(what)

    def _add(self, name: str, n: int) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def _add_calls(self, stage: str, n: int) -> None:
        with self.lock:
            self.stage_llm_calls[stage] += n

    def _count(self, stage: str, run: int = 0, reused: int = 0) -> None:
        with self.lock:
            self.stage_items[stage]["run"] += run
            self.stage_items[stage]["reused"] += reused

    def _generate(self, stage: str, batch: list[list[dict]], params: GenerationParams, desc: str,
                  schema=None) -> list[Completion]:
        """Task-LLM completions in chunks of the runtime's batch size; counts real calls.
        ``schema`` (a :class:`llm.structured.JsonSchema`) constrains every completion."""
        out = []
        bs = max(1, self.rt.batch_size)
        for i in tqdm(range(0, len(batch), bs), desc=desc, disable=not self.settings.progress or len(batch) <= bs,
                      unit="batch", leave=False):
            chunk = batch[i: i + bs]
            with self.runner.model_lock:
                comps = (self.task.generate(chunk, params) if schema is None
                         else self.task.generate(chunk, params, schemas=[schema] * len(chunk)))
            self._add_calls(stage, sum(1 for c in comps if not getattr(c, "cached", False)))
            out += comps
        return out

    def run_conversation(self, conv: Conversation, info: ProgramInfo, sandbox: SandboxedProgram):
        """One conversation in ``sandbox`` (a fresh one): (task results, trace)."""
        return self._run_conversation(self.source, conv, info, sandbox)

    def _run_conversation(self, source: str, conv: Conversation, info: ProgramInfo, sandbox: SandboxedProgram):
        trace, extract_keys = self._extract(conv, info)
        index_key = stable_hash("index", self.stage_hash["index"], self.rt.embedder.model_id,
                                self._identity("task") if self.settings.program_llm_calls else None,
                                self.settings.program_llm_calls, extract_keys)
        blob = self.cache.get("index", index_key)
        if blob is None:
            self._index(conv, trace, sandbox)
            self.cache.put("index", index_key, sandbox.snapshot())
            live = sandbox
        else:
            self._count("index", reused=len(trace.units))
            live = None  # restored into the given (fresh) sandbox only if a retrieve must run

        def memory() -> SandboxedProgram:
            nonlocal live
            if live is None:
                try:
                    sandbox.restore(blob)
                except SandboxError as e:
                    raise ProgramRunError(f"cannot restore the built memory: {e.kind}: {e.reason}", stage="index",
                                          conversation=conv.id) from None
                live = sandbox
            return live

        questions = list(conv.questions)
        plans = self._plan(questions, info)
        results = self._retrieve(conv.id, index_key, [p["query"] for p in plans], info, memory, "questions")
        if self.settings.diagnostics:
            index = conv.turn_index
            turns = list(dict.fromkeys(e for q in questions for e in q.evidence if e in index))
            probe_queries = [text_query(info.query_fields, index[t][1].text or index[t][1].image_caption or "")
                             for t in turns]
            probes = self._retrieve(conv.id, index_key, probe_queries, info, memory, "evidence")
            trace.probes = {t: r["text"] for t, r in zip(turns, probes)}
        budget = self.runner.context_budget
        texts = [budget.cut(r["text"]) if budget else r["text"] for r in results]
        preds = self._answer(questions, info, texts)
        scores = self._score(questions, texts, preds)
        tasks = [TaskResult(conv.id, q, p["query"], p["ok"], t, pr, s["score"], r["error"], s["judge"], s["detail"])
                 for q, p, r, t, pr, s in zip(questions, plans, results, texts, preds, scores)]
        return tasks, trace

    # ------------------------------------------------------------------ stages

    def _index(self, conv: Conversation, trace: ConversationTrace, sandbox: SandboxedProgram) -> None:
        try:
            sandbox.construct()
            for x, units in tqdm(list(zip(conv.sessions, trace.units)), desc=f"index {conv.id}", leave=False,
                                 disable=not self.settings.progress, unit="session"):
                value = sandbox.index(units, SessionInfo.from_session(x).to_dict())
                if value is not None:
                    raise ProgramRunError(f"Memory.index returned {type(value).__name__}, not None (session "
                                          f"{x.index})", stage="index", conversation=conv.id)
                self._count("index", run=1)
        except SandboxError as e:
            raise ProgramRunError(f"{e.kind}: {e.reason}", stage="index", conversation=conv.id) from None

    def _plan(self, questions: list[QAItem], info: ProgramInfo) -> list[dict]:
        s = self.settings
        fields = [f.to_dict() for f in info.query_fields]
        ident = (s.plan_mode, self._identity("task") if s.plan_mode == "llm" else None, s.plan_max_new_tokens, fields)
        if s.constrained and s.plan_mode == "llm":
            ident += ("constrained", s.constrained_max_chars, s.constrained_max_items)
        keys = [stable_hash("plan", self.stage_hash["plan"], ident, q.question, q.question_date) for q in questions]
        cached = [self.cache.get_json("plan", k) for k in keys]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("plan", run=len(todo), reused=len(questions) - len(todo))
        if todo and s.plan_mode == "llm":
            batch = [planning_messages(info.planning_instruction, questions[i].question, questions[i].question_date,
                                       info.query_fields) for i in todo]
            comps = self._generate("plan", batch, GenerationParams(max_new_tokens=s.plan_max_new_tokens), "plan",
                                   bounded(query_schema(info.query_fields), s.constrained_max_chars,
                                           s.constrained_max_items) if s.constrained else None)
        else:
            comps = [None] * len(todo)
        for i, comp in zip(todo, comps):
            value = None
            if comp is not None:
                try:  # a cut-off plan is a failed plan: the fallback query is used
                    value = {"query": dataclasses.asdict(parse_structured(require_complete(comp, "plan"),
                                                                          info.query_class(), many=False)),
                             "ok": True}
                except (StructuredOutputError, TruncatedOutputError):
                    value = None
            if value is None:
                value = {"query": text_query(info.query_fields, questions[i].question), "ok": s.plan_mode == "question"}
            self.cache.put_json("plan", keys[i], value)
            cached[i] = value
        self._add("plan_failures", sum(1 for c in cached if not c["ok"]))
        return cached

    def _retrieve(self, conv_id: str, index_key: str, queries: list[dict | None], info: ProgramInfo, memory,
                  what: str) -> list[dict]:
        keys = [stable_hash("retrieve", self.stage_hash["retrieve"], index_key, q) for q in queries]
        cached = [self.cache.get_json("retrieve", k) for k in keys]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("retrieve", run=len(todo), reused=len(queries) - len(todo))
        for i in tqdm(todo, desc=f"retrieve {conv_id} ({what})", disable=not self.settings.progress, leave=False,
                      unit="query"):
            value = {"text": "", "error": None}
            if queries[i] is None:
                value["error"] = "the Query schema has no str or list[str] field to carry the text"
            else:
                try:
                    out = memory().retrieve(queries[i])
                    if not isinstance(out, str):
                        value["error"] = f"retrieve returned {type(out).__name__}, not str"
                    elif len(out) > OUT_CHAR_BUDGET:
                        value["error"] = f"retrieve returned {len(out)} characters > {OUT_CHAR_BUDGET}"
                    else:
                        value["text"] = out
                except ProgramRaised as e:
                    value["error"] = f"retrieve raised {e.reason}"[:300]
                except SandboxError as e:
                    raise ProgramRunError(f"{e.kind}: {e.reason}", stage="retrieve", conversation=conv_id) from None
            self.cache.put_json("retrieve", keys[i], value)
            cached[i] = value
        if what == "questions":
            self._add("retrieve_errors", sum(1 for c in cached if c["error"]))
        return cached

    def _answer(self, questions: list[QAItem], info: ProgramInfo, retrieved: list[str]) -> list[str | None]:
        if not self.scorer.needs_prediction:
            return [None] * len(questions)
        s = self.settings
        ident = (self._identity("task"), s.answer_max_new_tokens)
        keys = [stable_hash("answer", self.stage_hash["answer"], ident, q.question, q.question_date, r)
                for q, r in zip(questions, retrieved)]
        cached = [self.cache.get_json("answer", k) for k in keys]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("answer", run=len(todo), reused=len(questions) - len(todo))
        if todo:
            batch = [answer_messages(info.answer_instruction, questions[i].question, retrieved[i],
                                     questions[i].question_date) for i in todo]
            comps = self._generate("answer", batch, GenerationParams(max_new_tokens=s.answer_max_new_tokens), "answer")
            for i, comp in zip(todo, comps):
                cached[i] = clean_answer(comp.text)
                self.cache.put_json("answer", keys[i], cached[i])
        return cached

    def _score(self, questions: list[QAItem], retrieved: list[str], preds: list[str | None]) -> list[dict]:
        """``{"score", "judge", "detail"}`` per question (judge requests and replies of an LLM
        scorer; a cached plain float from an older cache reads as a score without them)."""
        keys = [stable_hash("score", self.stage_hash["score"], self._identity("scorer"), q.question, q.answer,
                            q.category, p, r if not self.scorer.needs_prediction else None,
                            *([q.id, list(q.rubric)] if q.rubric or self.settings.scorer == "llm" else []))
                for q, r, p in zip(questions, retrieved, preds)]
        cached = [self.cache.get_json("score", k) for k in keys]
        cached = [c if c is None or isinstance(c, dict) else {"score": float(c), "judge": [], "detail": None}
                  for c in cached]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("score", run=len(todo), reused=len(questions) - len(todo))
        if todo:
            items = [ScoreItem(questions[i].question, questions[i].answer, preds[i] or "", retrieved[i],
                               questions[i].category, questions[i].id, questions[i].rubric) for i in todo]
            with self.runner.model_lock:
                calls0 = self.rt.calls_snapshot()
                values = self.scorer.score(items)
                last = list(getattr(self.scorer, "last", None) or [])
                judged = self.rt.calls_since(calls0)["calls"].get("judge", 0)
            if len(last) != len(todo):
                last = [None] * len(todo)
            for i, v, j in zip(todo, values, last):
                cached[i] = {"score": float(v), "judge": j.calls if j is not None else [],
                             "detail": j.detail if j is not None else None}
                if j is None or not j.unreadable:  # an unreadable judge reply is asked again next time
                    self.cache.put_json("score", keys[i], cached[i])
            self._add_calls("score", judged)
        return cached
