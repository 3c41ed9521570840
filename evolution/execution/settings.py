""":class:`RunnerSettings`, how the program runner executes a program. Every field that changes
a stage's output is part of that stage's cache key.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from data_synth.extractors import extractor_kind
from evolution.execution.sandbox import SandboxLimits


@dataclass
class RunnerSettings:
    """How the runner executes a program.

    extractor: ``instruction`` | ``turns`` | ``expert:<file or conv-NN>[,...]`` | a trained
    extractor's backend spec. task_model: the task LLM's spec. plan_mode: ``llm`` | ``question``.
    scorer: ``answer-recall`` | ``f1`` | ``rubric-recall`` | ``llm`` (with ``judge_model``;
    :func:`rewards.scoring.scorers.make_scorer`). Token budgets in the model's tokens.
    program_llm_calls: toolkit.llm budget per sandbox. diagnostics: also probe with evidence
    (d_idx). workers: concurrent conversations. constrained / judge_constrained /
    constrained_max_chars / constrained_max_items: structured decoding. judge_protocol:
    ``official`` | ``corrected``. context_tokens: the :class:`ContextBudget` (None = none).
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

