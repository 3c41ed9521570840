"""How the program runner executes a program: :class:`RunnerSettings` (the extraction mode,
the task and judge models, plan mode, scorer, token budgets, constrained decoding, sandbox
limits, concurrency and the scoring context budget). Every field that changes a stage's output
is part of that stage's cache key (:mod:`evolution.execution.run_state`)."""
from __future__ import annotations

from dataclasses import dataclass, field

from data_synth.extractors import extractor_kind
from evolution.execution.sandbox import SandboxLimits


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
    extractor_segment_tokens: int | None = None
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

