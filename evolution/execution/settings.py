"""The settings sections a program run is configured by, each declared once and composed by the
recipes of ``memgym eval``, ``memgym program eval`` and ``memgym evolve`` by inheritance:

- :class:`ModelsSection`: the task and judge models and how they are reached (batch, response
  cache, request timeout and retries); :meth:`ModelsSection.runtime` builds the
  :class:`memgym.llm.runtime.Runtime`;
- :class:`OutputSection`: the output directory and the stage-output cache;
- :class:`ProgramSection`: the memory program a command runs;
- :class:`RunnerSettings`: how the program runner executes a program (extraction, planning,
  scoring, token limits, constrained decoding, sandbox time, concurrency, the context budget),
  over the data section :class:`memgym.rewards.scoring.selection.BenchmarkFields` (the dataset and
  judge protocol reach the scorer) and :class:`ModelsSection`. A recipe composed of it IS the
  runner's settings: :class:`memgym.evolution.execution.runner.ProgramRunner` receives the recipe itself.

Each section validates itself once, when built (:class:`memgym.llm.checks.Section`). Every field that
changes a stage's output is part of that stage's cache key (:mod:`memgym.evolution.execution.run_state`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from memgym.data_synth.extractors import extractor_kind
from memgym.evolution.execution.sandbox import SandboxLimits
from memgym.llm.checks import Section, require
from memgym.rewards.scoring.selection import BenchmarkFields, answer_tokens_for


@dataclass
class ModelsSection(Section):
    """The task and judge models and their endpoints. Backend specs: ``hf:<dir or name>``,
    ``openai:<url>#<model>``, ``vllm:<dir>`` (:func:`memgym.llm.specs.parse_spec`)."""

    CHECKS = {"task_model": {"spec": "backend"}, "judge_model": {"spec": "backend"}, "batch_size": {"min": 1},
              "request_timeout_s": {"min": 0.001}, "request_retries": {"min": 0}}

    task_model: str = field(default="hf:smollm2", metadata={"help": "task LLM spec (plan, answer, instruction "
                                                                    "extraction, the program's toolkit.llm)"})
    judge_model: str | None = field(default=None, metadata={"help": "judge spec for scorer llm"})
    batch_size: int = field(default=8, metadata={"help": "LLM generation batch"})
    cache: str | None = field(default=None, metadata={"help": "sqlite response cache (default: the command's; "
                                                              "'none' disables)"})
    request_timeout_s: float | None = field(default=None, metadata={
        "help": "seconds per request to an openai: server (default $MEMGYM_REQUEST_TIMEOUT_S or 60)"})
    request_retries: int | None = field(default=None, metadata={
        "help": "retries of a failed openai: request, each logged with its reason (default $MEMGYM_REQUEST_RETRIES "
                "or 5)"})

    def runtime(self, cache: str | None = None, embedder=None):
        """The :class:`memgym.llm.runtime.Runtime` of these settings: response cache ``self.cache``, else
        ``cache``; ``embedder`` (an embedder object) replaces the default one."""
        from memgym.llm.runtime import Runtime

        kw = dict(batch_size=self.batch_size, request_timeout_s=self.request_timeout_s,
                  request_retries=self.request_retries)
        rt = Runtime.from_config(cache=self.cache or cache, **kw)
        return rt if embedder is None else Runtime(cache=rt.cache, embedder=embedder, **kw)


@dataclass
class OutputSection(Section):
    """Where a command writes: its output directory and its stage-output cache."""

    CHECKS = {"out": {"out_dir": True}}

    out: str | None = field(default=None, metadata={
        "help": "output directory (default: runs/evolve, runs/program_eval, runs/eval by command)"})
    stage_cache: str | None = field(default=None, metadata={
        "help": "stage-output cache (sqlite; default: evolve <out>/stages.sqlite, shared by an experiment's runs; "
                "eval and program eval $MEMGYM_CACHE/stages.sqlite); 'none' = memory only"})


@dataclass
class ProgramSection(Section):
    """The memory program a command runs: a Python module file (:mod:`memgym.memory_bank.contract`)."""

    program: str | None = field(default=None, metadata={
        "help": "memory program file (eval: default memory_bank/programs/bank.py, MemBuilder's four-part bank, core "
                "block + top-10 entries, indexing the extractors' entries; program eval: the CLI's FILE.py)"})


@dataclass
class RunnerSettings(BenchmarkFields, ModelsSection):
    """How the runner executes a program.

    extractor: ``instruction`` (the task LLM with EXTRACTION_INSTRUCTION), ``turns`` (no
    model: every dialogue turn is a unit, :func:`turn_entries`), ``expert:<file or
    conv-NN>[,...]`` (replay), or a trained extractor's backend spec ``hf:<dir>`` /
    ``openai:<url>#<model>``. plan_mode: ``llm`` (the task LLM with PLANNING_INSTRUCTION) or
    ``question`` (no LLM call: the question text goes into the Query by
    :func:`memgym.memory_bank.contract.text_query`; an offline/ablation setting). scorer: ``grounded-recall``
    (the default offline scorer, :mod:`memgym.rewards.scoring.grounded`: gold evidence held verbatim, so it
    measures programs over ``turns`` or extractors that copy text) | ``f1`` | ``llm`` (then
    ``judge_model``: the official judge of ``dataset``, see
    :func:`memgym.rewards.scoring.scorers.make_scorer`) | the word-coverage proxies ``answer-recall`` and
    ``rubric-recall`` (BEAM), kept as named alternatives (:data:`memgym.rewards.scoring.scorers.BLIND_SPOTS`).
    The three left None = the command's default (``COMMAND_DEFAULTS``, :class:`memgym.llm.checks.Section`;
    a bare :class:`RunnerSettings` takes ``instruction``, ``llm``, ``grounded-recall``). Token limits are in tokens of the respective
    model; ``answer_max_new_tokens`` None = the dataset's (:attr:`answer_tokens`).
    program_llm_calls: toolkit.llm budget per conversation's sandbox. diagnostics: also retrieve
    with each evidence turn as the query (d_idx). workers: conversations of one evaluation run
    concurrently (one sandbox each). constrained: decode instruction extraction under the
    program's MemoryUnit-list schema, plans under its Query schema, and a trained extractor's
    manager outputs under theirs (:mod:`memgym.memory_bank.record_schemas`,
    :mod:`memgym.memory_bank.action_schemas`); judge_constrained: the judge's verdicts under theirs
    (memgym's own judge only, ``dataset`` None); constrained_max_chars / constrained_max_items
    bound every string / list of the extraction and plan schemas (:func:`memgym.llm.structured.bounded`).
    call_timeout_s: sandbox seconds per index/retrieve call (:attr:`sandbox`). context_tokens:
    the context budget (None = none): each retrieved text is cut to this many tokens of
    ``context_tokenizer`` before the answer and score stages
    (:class:`memgym.rewards.scoring.context_budget.ContextBudget`), the same for every program.
    """

    COMMAND_DEFAULTS = {"extractor": "instruction", "plan_mode": "llm", "scorer": "grounded-recall"}
    CHECKS = {"extractor": {"spec": "extractor", "words": ("instruction", "turns")},
              "plan_mode": {"choices": ("llm", "question")},
              "scorer": {"choices": ("grounded-recall", "answer-recall", "rubric-recall", "f1", "llm")},
              "extract_max_new_tokens": {"min": 1}, "extractor_max_new_tokens": {"min": 1},
              "extractor_context_tokens": {"min": 2}, "extractor_segment_tokens": {"min": 1},
              "plan_max_new_tokens": {"min": 1}, "answer_max_new_tokens": {"min": 1}, "program_llm_calls": {"min": 0},
              "constrained_max_chars": {"min": 1}, "constrained_max_items": {"min": 1},
              "call_timeout_s": {"min": 0.001}, "workers": {"min": 1}, "context_tokens": {"min": 1}}

    extractor: str | None = field(default=None, metadata={
        "help": "instruction | turns | expert:<file or conv-NN>[,...] | hf:<checkpoint or adapter dir> | "
                "openai:<url>#<model>; eval takes an expert or model spec, which may end in ' constrained' or ' free' "
                "to override `constrained` for that column (default: eval hf:smollm2, program eval instruction, "
                "evolve turns)"})
    plan_mode: str | None = field(default=None, metadata={
        "help": "llm (PLANNING_INSTRUCTION) | question (no LLM: the question fills the Query) (default: eval and "
                "evolve question, program eval llm)"})
    scorer: str | None = field(default=None, metadata={
        "help": "grounded-recall (offline: the gold evidence held verbatim and the answer inside real conversation "
                "text) | f1 | llm (the dataset's official judge) | answer-recall | rubric-recall (beam; word-coverage "
                "proxies a query-independent word list games) (default: eval f1, program eval and evolve "
                "grounded-recall; eval also reports answer-recall beside it)"})
    extract_max_new_tokens: int = field(default=1024, metadata={"help": "tokens per instruction extraction"})
    extractor_max_new_tokens: int = field(default=512, metadata={"help": "tokens per trained-extractor output"})
    extractor_context_tokens: int | None = field(default=None, metadata={
        "help": "trained extractor's context window (tokens); longer sessions are built in segments (default: what "
                "the backend reports)"})
    extractor_segment_tokens: int | None = field(default=None, metadata={
        "help": "trained extractor: build every session in segments of at most this many transcript tokens (whole "
                "turns; the cut of segmented SFT, e.g. 200 for scripts/experiments/train_cpu/sft.yaml; default: whole "
                "sessions)"})
    plan_max_new_tokens: int = field(default=96, metadata={"help": "tokens per plan"})
    answer_max_new_tokens: int | None = field(default=None, metadata={
        "help": "tokens per answer (default by dataset: locomo 48, longmemeval 128, beam 512)"})
    program_llm_calls: int = field(default=0, metadata={"help": "toolkit.llm budget per conversation"})
    diagnostics: bool = field(default=True, metadata={"help": "compute d_ext/d_idx/d_ret"})
    constrained: bool = field(default=False, metadata={"help": "decode extraction (MemoryUnit list / manager "
                                                                 "outputs) and plans (Query) under their JSON schemas"})
    constrained_max_chars: int | None = field(default=None, metadata={
        "help": "constrained: at most this many characters per string field"})
    constrained_max_items: int | None = field(default=None, metadata={
        "help": "constrained: at most this many units per extraction (and items per list field)"})
    judge_constrained: bool = field(default=False, metadata={
        "help": "decode memgym's own judge verdicts under their schema (no dataset judge)"})
    call_timeout_s: float = field(default=60.0, metadata={"help": "sandbox seconds per index/retrieve call (> 0)"})
    workers: int = field(default=1, metadata={"help": "conversations evaluated concurrently (one sandbox each)"})
    context_tokens: int | None = field(default=None, metadata={
        "help": "context budget: every retrieved text is cut to this many tokens (of context_tokenizer) before it is "
                "answered and scored, the same for every program, so returning more text is no gain (None = none; "
                "the program's own 16,000-character limit still holds)"})
    context_tokenizer: str = field(default="smollm2", metadata={
        "help": "tokenizer of the context budget: smollm2 (the embedded task model's) | hf:<dir>"})
    progress: bool = field(default=True, metadata={"help": "progress bars: on (true) or off (--no_progress)"})

    def check(self) -> None:
        super().check()
        if self.plan_mode not in ("llm", "question"):
            from memgym.llm.errors import ConfigError
            raise ConfigError(f"--plan_mode: {self.plan_mode!r} is not one of llm, question")
        require(self, "scorer", "llm", "judge_model", "(a backend spec of the LLM judge)")
        if self.scorer == "llm" and self.dataset is not None:
            from memgym.rewards.scoring.judge_protocols import load_judge_file
            load_judge_file(self.dataset, self.judge_protocol)  # a changed official file: refused before any run
        if self.scorer == "rubric-recall" and self.dataset not in (None, "beam"):
            from memgym.llm.errors import ConfigError
            raise ConfigError("--scorer rubric-recall needs --dataset beam (it scores BEAM rubrics)")
        if self.context_tokens is not None:
            from memgym.rewards.scoring.context_budget import ContextBudget
            ContextBudget(self.context_tokens, self.context_tokenizer)  # ValueError names the field
        if extractor_kind(self.extractor) == "extractor":
            from memgym.llm.specs import parse_spec
            parse_spec(self.extractor)  # BackendSpecError names the spec

    def model_specs(self) -> dict[str, str | None]:
        """Role -> model spec of these settings, for the run card (:func:`memgym.llm.runcard.build_card`):
        the extractor, the task model, the judge (scorer ``llm`` only), the context budget's
        tokenizer (when set) and a coder (evolve's ``coder_model``, when the recipe has one)."""
        return {"extractor": self.extractor, "task_model": self.task_model,
                "judge_model": self.judge_model if self.scorer == "llm" else None,
                "context_tokenizer": self.context_tokenizer if self.context_tokens else None,
                "coder_model": getattr(self, "coder_model", None)}

    @property
    def extraction_mode(self) -> str:
        return extractor_kind(self.extractor)

    @property
    def answer_tokens(self) -> int:
        """``answer_max_new_tokens``, or the dataset's default (:data:`memgym.rewards.scoring.selection.ANSWER_TOKENS`)."""
        return answer_tokens_for(self.dataset, self.answer_max_new_tokens)

    @property
    def sandbox(self) -> SandboxLimits:
        """The sandbox limits: ``call_timeout_s`` per call, loading at least 20 s."""
        return SandboxLimits(call_timeout_s=self.call_timeout_s, load_timeout_s=max(20.0, self.call_timeout_s))
