"""ADRPO's recipe, in TRL's split (``GRPOScriptArguments`` / ``GRPOConfig`` / ``ModelConfig``):
:class:`ADRPOScriptArguments` (data, the reward's models, the in-trainer measurement),
:class:`memgym.rewards.reward_types.SessionRewardConfig` (the reward's settings, as the reward takes
them), :class:`ADRPOConfig` (TRL's ``GRPOConfig`` plus the weighting) and
:class:`memgym.training.common.PolicyModelConfig`. Source: MemBuilder (arXiv 2601.05488) §3.4 and
Eq. 12, with the correction of docs/design.md § "Dense session reward and ADRPO", step 7.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import trl
from trl import GRPOConfig

from memgym.llm.embeddings import EMBEDDER_HELP, check_embedder_spec
from memgym.llm.errors import MemgymError
from memgym.llm.checks import check_fields, require
from memgym.rewards.reward_types import SessionRewardConfig
from memgym.training.callbacks import MemoryEvalFields

#: ``advantage``: the corrected weighting, stock TRL loss with each completion's advantage × w(m);
#: ``unclipped``: the paper's Eq. 12 (ablation, :mod:`memgym.training.adrpo_eq12`); ``none``: stock GRPO.
WEIGHTINGS = ("advantage", "unclipped", "none")
#: The TRL minor version whose ``GRPOTrainer._compute_loss`` :meth:`ADRPOEq12Trainer._compute_loss` mirrors.
TRL_VERSION = "1.16."
#: Loss types of TRL 1.16 that share the clipped per-token surrogate -min(ρA, clip(ρ)A).
EQ12_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


class ADRPOConfigError(MemgymError, ValueError):
    """An ADRPO setting that is out of range or that cannot work with the others (exit status 2)."""

    kind = "usage"


def check_eq12_support(args) -> None:
    """Raise :class:`ADRPOConfigError` naming the setting when ``args`` asks for something the
    Eq. 12 loss does not support (see :mod:`memgym.training.adrpo_eq12`); what only the loaded
    model tells (a vision model, the router aux loss), the trainer checks."""
    if not trl.__version__.startswith(TRL_VERSION):
        raise ADRPOConfigError(f"weighting: unclipped mirrors TRL {TRL_VERSION}x's GRPO loss; installed TRL is "
                               f"{trl.__version__} (use weighting: advantage, which runs on TRL's own loss)")
    if args.loss_type not in EQ12_LOSS_TYPES:
        raise ADRPOConfigError(f"weighting: unclipped needs a clipped per-token loss; loss_type {args.loss_type!r} "
                               f"is not one of {EQ12_LOSS_TYPES} (weighting: advantage supports every TRL loss type)")
    if args.entropy_coef != 0.0 or args.use_adaptive_entropy:
        raise ADRPOConfigError("weighting: unclipped does not support the entropy bonus "
                               "(entropy_coef / use_adaptive_entropy)")


@dataclass
class ADRPOScriptArguments(MemoryEvalFields):
    """The ADRPO script's own arguments (TRL's ``GRPOScriptArguments``): ``init_from`` (SFT model or
    adapter dir), the reward's models and cache, and the rollout rows
    (:func:`memgym.training.reward_rows.reward_rows`; ``segment_tokens``: rows on session segments).
    Raises :class:`ADRPOConfigError` naming the field."""

    _argument_group_name = "ADRPOScriptArguments: the policy to start from, the reward's models, the rows"

    CHECKS = {"screen_rows": {"min": 1}, "memory_eval_rows": {"min": 1}, "memory_eval_heldout_turns": {"min": 1},
              "memory_eval_max_new_tokens": {"min": 1}, "answer_max_new_tokens": {"min": 1},
              "max_prompt_tokens": {"min": 1}, "segment_tokens": {"min": 1}, "answer_model": {"spec": "backend"},
              "judge_model": {"spec": "backend"}}

    init_from: str | None = field(default=None, metadata={
        "help": "start from an SFT checkpoint dir (full model) or a LoRA adapter dir; overrides model_name_or_path"})
    # the reward's models
    answer_model: str | None = field(default=None, metadata={
        "help": "backend spec of the answer model (judge f1 / llm), e.g. hf:smollm2 or openai:<url>#<model>"})
    judge_model: str | None = field(default=None, metadata={"help": "backend spec of the LLM judge (judge llm)"})
    answer_max_new_tokens: int = field(default=48, metadata={"help": "tokens per answer of the answer model"})
    reward_cache: str | None = field(default=None, metadata={
        "help": "sqlite response cache of the answer/judge models (default under $MEMGYM_CACHE; 'none' disables)"})
    embedder: str = field(default="minilm", metadata={
        "help": f"retrieval embedder: {EMBEDDER_HELP}"})
    # data
    train_trajectories: list[str] = field(default_factory=lambda: ["conv-26"], metadata={
        "help": "expert trajectory files, or names looked up in $MEMGYM_DATA/expert (conv-26)"})
    qa_path: str | None = field(default=None, metadata={"help": "session QA file (memgym synth qa); default: "
                                                                "the trajectories' own qa"})
    dataset: str = field(default="locomo", metadata={"help": "locomo | longmemeval (the transcripts)"})
    data_path: str | None = field(default=None, metadata={"help": "benchmark file (default under $MEMGYM_DATA)"})
    managers: list[str] = field(default_factory=lambda: ["core", "episodic", "semantic", "procedural"],
                                metadata={"help": "managers to train"})
    sessions: list[int] | None = field(default=None, metadata={"help": "only these session indices"})
    row_keys: list[str] | None = field(default=None, metadata={
        "help": "only the rows with these keys (conv-26/s2/semantic), e.g. those a pre-screen found with reward "
                "variance (scripts/experiments/adrpo_weighting/run.py screen); null: every row"})
    max_prompt_tokens: int | None = field(default=None, metadata={
        "help": "drop rows whose chat prompt is longer (policy tokens); TRL 1.16 has no prompt cap"})
    screen_rows: int | None = field(default=None, metadata={
        "help": "data preparation: train on the first N rows (after the filters above) whose num_generations rollouts "
                "from the initial policy get different rewards (memgym.training.adrpo_data.screen_rows); null: every row"})
    segment_tokens: int | None = field(default=None, metadata={
        "help": "one row per session SEGMENT of whole turns of <= this many transcript tokens, with the QA the "
                "segment completes (memgym.training.reward_rows; the cut of segmented SFT's segment_tokens); "
                "null: whole-session rows"})

    def __post_init__(self):
        try:  # string -> one-element list for the list fields, counts and specs (memgym.llm.checks)
            check_fields(self)
            check_embedder_spec(self.embedder, allow_none=False)
        except ValueError as e:
            raise ADRPOConfigError(f"ADRPOScriptArguments: {e}") from None
        if not self.train_trajectories:
            raise ADRPOConfigError(f"ADRPOScriptArguments.train_trajectories must be a non-empty list, "
                                   f"got {self.train_trajectories!r}")
        if self.segment_tokens is not None and self.qa_path is not None:
            raise ADRPOConfigError(
                "ADRPOScriptArguments.segment_tokens: segment rows take their QA from the trajectories' own qa (by "
                f"evidence turn); unset qa_path (got {self.qa_path!r})")


def check_recipe(script_args: ADRPOScriptArguments, reward: SessionRewardConfig) -> None:
    """The rules across the two sections: the judge's models, and segment rows scored one manager at
    a time. Raises :class:`ADRPOConfigError` naming the flags."""
    from types import SimpleNamespace

    both = SimpleNamespace(**vars(script_args), **vars(reward))
    try:
        require(both, "judge", "f1", "answer_model", "(the model whose answers F1 scores)")
        require(both, "judge", "llm", "answer_model", "(the model whose answers the judge grades)")
        require(both, "judge", "llm", "judge_model", "(a backend spec of the LLM judge)")
    except ValueError as e:
        raise ADRPOConfigError(f"ADRPO recipe: {e}") from None
    if script_args.segment_tokens is not None and reward.mode == "joint":
        raise ADRPOConfigError("ADRPOScriptArguments.segment_tokens: segment rows are scored one manager at a time; "
                               "use mode counterfactual or isolated (got 'joint')")


@dataclass
class ADRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` (every field passes through to ``GRPOTrainer``) plus ``weighting``
    (:data:`WEIGHTINGS`) and ``constrained`` (refused). Raises :class:`ADRPOConfigError` naming the
    field for an unknown weighting or a setting ``weighting: unclipped`` does not support
    (:func:`check_eq12_support`).
    """

    _argument_group_name = ("ADRPOConfig: every trl.GRPOConfig field "
                            "(https://huggingface.co/docs/trl/main/en/grpo_trainer#trl.GRPOConfig), then "
                            "--weighting and --constrained")

    weighting: str = field(default="advantage", metadata={
        "help": "advantage (corrected: TRL's loss with each advantage x w(m)) | unclipped (paper Eq. 12, ablation; "
                "loss_type grpo/bnpo/dr_grpo/dapo only) | none"})
    constrained: bool = field(default=False, metadata={
        "help": "refused (must stay false): schema-constrained decoding is an inference option only"})

    def __post_init__(self):
        generation_batch_given = self.generation_batch_size is not None
        try:
            super().__post_init__()
        except ValueError as e:
            if generation_batch_given or "divisible by num_generations" not in str(e):
                raise
            # TRL names generation_batch_size, which the user did not set: name the flags they did
            raise ADRPOConfigError(
                f"ADRPOConfig: per_device_train_batch_size ({self.per_device_train_batch_size}) x processes "
                f"({self.world_size}) x steps_per_generation ({self.steps_per_generation}, default "
                f"gradient_accumulation_steps) = {self.generation_batch_size} completions per generation batch, "
                f"not a multiple of num_generations ({self.num_generations}); change --per_device_train_batch_size, "
                "--gradient_accumulation_steps (or --steps_per_generation) or --num_generations") from None
        if self.constrained:
            raise ADRPOConfigError(
                "ADRPOConfig.constrained: ADRPO rollouts cannot be schema-constrained. GRPO's policy gradient needs "
                "completions sampled from the policy's own distribution (a grammar mask changes it, so the "
                "log-probability ratios and the KL term would be wrong); set constrained: false. Constrained "
                "decoding is for inference (memgym eval / program eval / synth), see docs/design.md "
                "§ 'Structured outputs'.")
        if self.weighting not in WEIGHTINGS:
            raise ADRPOConfigError(f"ADRPOConfig.weighting must be one of {WEIGHTINGS}, got {self.weighting!r}")
        if self.weighting == "unclipped":  # the Eq. 12 loss's limits, checked before any model loads
            check_eq12_support(self)
