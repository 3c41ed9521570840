"""ADRPO: TRL's ``GRPOTrainer`` with the dense session reward and corrected contribution-aware
weighting.

Source: ``DESIGN.md`` § "Dense session reward and ADRPO" and § "Training stack"; MemBuilder
(arXiv 2601.05488 §3.4) and its review (``../shared/seeds/004_2e899ffbe394021e.txt``, Eq. 12).

- Rows: one per (conversation, session, manager) (:mod:`training.adrpo_data`); the trainer
  keeps the key → :class:`rewards.samples.RewardSample` table (expert bank before the
  session, the session's QA, the expert outputs).
- Reward: :class:`rewards.session_reward.SessionReward`, called ONCE per generation batch by
  :class:`SessionRewardFunction`, which stashes the :class:`RewardBreakdown` of every completion.
- Weights: w(m) of each completion rides beside TRL's advantages as ``inputs["adrpo_weights"]``
  (B,) and enters the per-token objective of :mod:`training.adrpo_loss`: ``advantage`` (the
  corrected form), ``unclipped`` (the paper's Eq. 12, for the ablation) or ``none`` (stock
  TRL loss, untouched).
- Logs (trainer ``state.log_history``): ``reward_parts/{reward,gate,acc,lp,weight,
  format_error,frac_correct}`` means, ``dominant/{episodic,semantic,procedural,none}``
  counts per generation batch, ``frac_reward_zero_std/<mode>`` beside TRL's own
  ``frac_reward_zero_std``, and TRL's reward, kl, entropy and clip ratios.

Run: ``python -m training.adrpo --config launch/recipes/adrpo_cpu.yaml [--field value ...]``
or ``memgym train adrpo --config ...``.
"""
from __future__ import annotations

import logging
import math
import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from trl import GRPOConfig, GRPOTrainer
from trl.trainer.utils import nanmax, nanmin

from llm.config import check_fields, require
from rewards.samples import RewardSample
from rewards.session_reward import MODES, SessionReward, SessionRewardConfig
from training.adrpo_data import build_dataset, sample_table, session_block_sampler
from training.adrpo_loss import SUPPORTED_LOSS_TYPES, WEIGHTINGS, aggregate_loss, weighted_clipped_objective

logger = logging.getLogger(__name__)

PART_NAMES = ("episodic", "semantic", "procedural", "none")
LOGGED_PARTS = ("reward", "gate", "acc", "lp", "weight", "format_error", "frac_correct")


class ADRPOConfigError(ValueError):
    """An ADRPO setting that is out of range or that cannot work with the others."""


@dataclass
class ADRPOConfig(GRPOConfig):
    """TRL's ``GRPOConfig`` plus the ADRPO fields. Every TRL field (``use_vllm``, ``vllm_mode``
    colocate|server, ``loss_type``, ``beta``, ``epsilon``, ``num_generations``, ...) passes
    through to ``GRPOTrainer`` unchanged.

    Raises :class:`ADRPOConfigError` naming the field for an unknown weighting/mode/judge, an
    out-of-range reward setting (``alpha <= 0``, ``lam`` outside [0, 1], ...), a loss type the
    weighted objective does not support, or the entropy bonus under weighting. (Whether a
    ``joint`` generation batch holds whole sessions is checked by :class:`ADRPOTrainer`.)
    """

    CHECKS = {"lora_r": {"min": 1}, "lora_alpha": {"min": 1}, "retrieval_top_k": {"min": 1},
              "answer_max_new_tokens": {"min": 1}, "max_prompt_tokens": {"min": 1},
              "answer_model": {"spec": "backend"}, "judge_model": {"spec": "backend"}}

    # policy
    model_name_or_path: str = field(default="smollm2", metadata={
        "help": "policy: 'smollm2' (embedded), a local model dir, or a hub id cached locally"})
    init_from: str | None = field(default=None, metadata={
        "help": "start from an SFT checkpoint dir (full model) or a LoRA adapter dir; overrides model_name_or_path"})
    model_dtype: str = field(default="float32", metadata={"help": "weights dtype at load: auto | float32 | "
                                                                  "bfloat16 | float16"})
    use_peft: bool = field(default=False, metadata={"help": "train a new LoRA adapter (ignored with an adapter "
                                                            "init_from, which is trained further)"})
    lora_r: int = field(default=16, metadata={"help": "LoRA rank"})
    lora_alpha: int = field(default=32, metadata={"help": "LoRA scaling numerator (update scaled by alpha/r)"})
    lora_dropout: float = field(default=0.05, metadata={"help": "LoRA dropout in [0, 1)"})
    lora_target_modules: list[str] = field(default_factory=lambda: ["q_proj", "k_proj", "v_proj", "o_proj"],
                                           metadata={"help": "module names LoRA wraps"})
    # weighting
    weighting: str = field(default="advantage", metadata={
        "help": "advantage (corrected: -min(rho*wA, clip(rho)*wA)) | unclipped (paper Eq. 12, ablation) | none"})
    alpha: float = field(default=4.0, metadata={"help": "w(m) of the dominant part (> 0); others get 1"})
    # reward (mirrors rewards.session_reward.SessionRewardConfig)
    mode: str = field(default="counterfactual", metadata={"help": "counterfactual | isolated | joint"})
    judge: str = field(default="answer-recall", metadata={"help": "answer-recall | f1 | llm"})
    lam: float = field(default=0.8, metadata={"help": "length-penalty weight λ in [0, 1]"})
    attribution_on: str = field(default="all", metadata={"help": "all | correct questions count for h(m)"})
    retrieval_top_k: int = field(default=10, metadata={
        "help": "entries retrieved per question (SessionRewardConfig.top_k; TRL's top_k is the sampling top-k)"})
    correct_threshold: float = field(default=0.5, metadata={"help": "score >= this counts a question correct"})
    answer_model: str | None = field(default=None, metadata={
        "help": "backend spec of the answer model (judge f1 / llm), e.g. hf:smollm2 or openai:<url>#<model>"})
    judge_model: str | None = field(default=None, metadata={"help": "backend spec of the LLM judge (judge llm)"})
    answer_max_new_tokens: int = field(default=48, metadata={"help": "tokens per answer of the answer model"})
    reward_cache: str | None = field(default=None, metadata={
        "help": "sqlite response cache of the answer/judge models (default under $MEMGYM_CACHE; 'none' disables)"})
    embedder: str = field(default="minilm", metadata={
        "help": "retrieval embedder: minilm (embedded all-MiniLM-L6-v2) | hash (model-free, tests) | <dir>"})
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
    max_prompt_tokens: int | None = field(default=None, metadata={
        "help": "drop rows whose chat prompt is longer (policy tokens); TRL 1.16 has no prompt cap"})

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
        try:  # string -> one-element list for the list fields, counts and specs (llm.config)
            check_fields(self)
            require(self, "judge", "f1", "answer_model", "(the model whose answers F1 scores)")
            require(self, "judge", "llm", "answer_model", "(the model whose answers the judge grades)")
            require(self, "judge", "llm", "judge_model", "(a backend spec of the LLM judge)")
        except ValueError as e:
            raise ADRPOConfigError(f"ADRPOConfig: {e}") from None
        checks = [
            ("weighting", self.weighting in WEIGHTINGS, f"one of {WEIGHTINGS}"),
            ("alpha", self.alpha > 0, "> 0"),
            ("mode", self.mode in MODES, f"one of {MODES}"),
            ("embedder", bool(self.embedder), "minilm, hash or a model dir"),
            ("train_trajectories", bool(self.train_trajectories), "a non-empty list"),
        ]
        for name, ok, need in checks:
            if not ok:
                raise ADRPOConfigError(f"ADRPOConfig.{name} must be {need}, got {getattr(self, name)!r}")
        if self.weighting != "none" and self.loss_type not in SUPPORTED_LOSS_TYPES:
            raise ADRPOConfigError(
                f"ADRPOConfig: weighting {self.weighting!r} needs a clipped per-token loss; loss_type "
                f"{self.loss_type!r} is not one of {SUPPORTED_LOSS_TYPES} (use weighting: none to run it stock)")
        if self.weighting != "none" and (self.entropy_coef != 0.0 or self.use_adaptive_entropy):
            raise ADRPOConfigError("ADRPOConfig: the entropy bonus (entropy_coef / use_adaptive_entropy) is only "
                                   "supported with weighting: none")
        self.reward_config()  # validates judge, lam, attribution_on, retrieval_top_k, correct_threshold

    def reward_config(self) -> SessionRewardConfig:
        """The :class:`SessionRewardConfig` these fields describe. Raises
        :class:`ADRPOConfigError` naming the ADRPO field when one is out of range."""
        try:
            return SessionRewardConfig(mode=self.mode, judge=self.judge, lam=self.lam, alpha=self.alpha,
                                       attribution_on=self.attribution_on, top_k=self.retrieval_top_k,
                                       correct_threshold=self.correct_threshold)
        except ValueError as e:
            msg = str(e).replace("SessionRewardConfig.top_k", "retrieval_top_k")
            raise ADRPOConfigError(msg.replace("SessionRewardConfig.", "ADRPOConfig.")) from None


def _completion_text(completion) -> str:
    """TRL passes a conversational completion as ``[{"role": "assistant", "content": s}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        if isinstance(content, list):  # structured content parts
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content if isinstance(content, str) else ""
    raise TypeError(f"ADRPO reward: cannot read a completion of type {type(completion).__name__}")


class SessionRewardFunction:
    """The TRL reward function: looks rows up by their ``key`` column, calls the session reward
    once per generation batch and returns one float reward in [0, 1] per completion.

    ``reward``: a callable ``(samples, completions, rollout_index) -> list[RewardBreakdown]``
    (a :class:`SessionReward`); ``table``: key → :class:`RewardSample`. ``rollout_offset`` is
    set by the trainer before each batch: the global position of this process's first
    completion, so ``rollout_index = (offset + i) mod num_generations`` is k, the rollout's
    index within its group. ``breakdowns`` holds the last batch's breakdowns, in order.
    ``stop_token_ids`` (set by the trainer: the EOS and pad ids): a completion whose last
    token is none of them stopped on ``max_completion_length`` and is scored with
    ``finish_reason="length"``, i.e. as a ``truncated`` format failure (gate 0), the same test
    TRL's ``mask_truncated_completions`` uses.
    Raises KeyError naming an unknown key, ValueError when the reward returns the wrong count.
    """

    __name__ = "session_reward"

    def __init__(self, reward, table: dict[str, RewardSample], num_generations: int):
        self.reward, self.table, self.num_generations = reward, table, num_generations
        self.rollout_offset = 0
        self.breakdowns: list = []
        self.stop_token_ids: set[int] | None = None

    def finish_reasons(self, completion_ids) -> list[str] | None:
        """``"length"`` for each completion that did not end on a stop token, else ``"stop"``;
        None when the token ids or the stop ids are unknown."""
        if completion_ids is None or not self.stop_token_ids:
            return None
        return ["length" if len(ids) and int(ids[-1]) not in self.stop_token_ids else "stop"
                for ids in completion_ids]

    def __call__(self, prompts, completions, key=None, completion_ids=None, **kwargs) -> list[float]:
        if key is None:
            raise KeyError("ADRPO reward: the batch has no 'key' column (rows must come from training.adrpo_data)")
        missing = [k for k in key if k not in self.table]
        if missing:
            raise KeyError(f"ADRPO reward: unknown sample key {missing[0]!r} ({len(missing)} unknown)")
        samples = [self.table[k] for k in key]
        texts = [_completion_text(c) for c in completions]
        group = self.num_generations
        rollout_index = [(self.rollout_offset + i) % group for i in range(len(texts))]
        reasons = self.finish_reasons(completion_ids)
        out = (self.reward(samples, texts, rollout_index=rollout_index) if reasons is None
               else self.reward(samples, texts, rollout_index=rollout_index, finish_reasons=reasons))
        if len(out) != len(texts):
            raise ValueError(f"ADRPO reward returned {len(out)} breakdowns for {len(texts)} completions")
        self.breakdowns = list(out)
        log_metric = kwargs.get("log_metric")
        stats = getattr(self.reward, "last_stats", None) or {}
        if log_metric is not None:  # failures that score 0 without being wrong answers
            for k in ("judge_unparsable", "empty_answers"):
                if k in stats:
                    log_metric(f"reward_failures/{k}", float(stats[k]))
            if reasons is not None:
                log_metric("reward_failures/truncated", float(sum(r == "length" for r in reasons)))
        log_extra = kwargs.get("log_extra")
        if log_extra is not None:
            log_extra("gate", [b.gate for b in out])
            log_extra("dominant", [b.dominant or "none" for b in out])
            log_extra("weight", [b.weight for b in out])
        return [float(b.reward) for b in out]


class ADRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the session reward and contribution-aware weights.

    Args:
        model: a model dir / hub id, a ``PreTrainedModel`` or a ``PeftModel`` (e.g. from
            :func:`training.common.load_policy`).
        args: :class:`ADRPOConfig`.
        samples: the :class:`RewardSample` rows (one per conversation, session, manager); in
            ``joint`` mode each session's four rows must be adjacent (the builder's order).
        reward: the session reward callable; default ``SessionReward(args.reward_config(), ...)``
            is built by :func:`build_trainer`, so here it is required.
        processing_class, peft_config, callbacks: as for ``GRPOTrainer``.
    Raises :class:`ADRPOConfigError` for a vision-language processor, a model with router aux
    loss under weighting, or (joint mode) per-process batches that would split a session.
    """

    def __init__(self, model, *, args: ADRPOConfig, samples: Sequence[RewardSample], reward,
                 processing_class=None, peft_config=None, callbacks=None):
        if not isinstance(args, ADRPOConfig):
            raise ADRPOConfigError(f"ADRPOTrainer needs an ADRPOConfig, got {type(args).__name__}")
        self.table = sample_table(samples)
        self.reward_fn = SessionRewardFunction(reward, self.table, args.num_generations)
        super().__init__(model, reward_funcs=[self.reward_fn], args=args, train_dataset=build_dataset(samples),
                         processing_class=processing_class, peft_config=peft_config, callbacks=callbacks)
        pad = getattr(self._tokenizer, "pad_token_id", None)
        self.reward_fn.stop_token_ids = {int(t) for t in self.eos_token_ids} | ({int(pad)} if pad is not None else set())
        if args.weighting != "none":
            if self._is_vlm:
                raise ADRPOConfigError("ADRPOTrainer: weighting is implemented for text-only models")
            if self.aux_loss_enabled:
                raise ADRPOConfigError("ADRPOTrainer: router aux loss is only supported with weighting: none "
                                       "(set router_aux_loss_coef: 0)")
        if args.mode == "joint":
            per_process = args.per_device_train_batch_size * args.steps_per_generation
            if per_process % (4 * args.num_generations):
                raise ADRPOConfigError(
                    f"joint mode: each process scores {per_process} completions per generation batch, not a multiple "
                    f"of 4 managers x {args.num_generations} generations, so a session would be split")

    # ---- data order -----------------------------------------------------------------
    def _get_train_sampler(self, dataset=None):
        if self.args.mode != "joint":
            return super()._get_train_sampler(dataset)
        return session_block_sampler(dataset if dataset is not None else self.train_dataset, block=4,
                                     mini_repeat_count=self.num_generations,
                                     batch_size=self.args.generation_batch_size // self.num_generations,
                                     repeat_count=self.num_iterations * self.args.steps_per_generation,
                                     shuffle=self.shuffle_dataset, seed=self.args.seed)

    # ---- rollouts, rewards, weights ----------------------------------------------------
    def _generate_and_score_completions(self, inputs):
        mode = "train" if self.model.training else "eval"
        self.reward_fn.rollout_offset = self.accelerator.process_index * len(inputs)
        self.reward_fn.breakdowns = []
        output = super()._generate_and_score_completions(inputs)
        bds = self.reward_fn.breakdowns
        if len(bds) != len(inputs):
            raise RuntimeError(f"ADRPO: the reward stashed {len(bds)} breakdowns for {len(inputs)} completions")
        device = output["advantages"].device
        output["adrpo_weights"] = torch.tensor([float(b.weight) for b in bds], dtype=torch.float32, device=device)
        self._log_reward_parts(bds, mode, device)
        return output

    def _log_reward_parts(self, bds, mode: str, device) -> None:
        """Sum the breakdowns' parts over all processes and append the means (parts) and counts
        (dominant parts) to TRL's metrics, which ``log`` averages into ``state.log_history``."""
        logs = [b.to_log() for b in bds]
        names = [f"reward_parts/{p}" for p in LOGGED_PARTS] + [f"dominant/{p}" for p in PART_NAMES]
        sums = [sum(d[p] for d in logs) for p in LOGGED_PARTS] + [sum(d[f"dominant/{p}"] for d in logs)
                                                                   for p in PART_NAMES]
        local = torch.tensor(sums + [float(len(logs))], dtype=torch.float64, device=device)
        total = self.accelerator.gather(local.unsqueeze(0)).sum(dim=0).tolist()
        n = max(total[-1], 1.0)
        for i, name in enumerate(names):
            value = total[i] / n if name.startswith("reward_parts/") else total[i]
            self._metrics[mode][name].append(value)
        zero_std = self._metrics[mode].get("frac_reward_zero_std")
        if zero_std:
            self._metrics[mode][f"frac_reward_zero_std/{self.args.mode}"].append(zero_std[-1])

    # ---- the weighted loss -----------------------------------------------------------
    def _compute_loss(self, model, inputs):
        """``weighting: none`` → TRL's loss unchanged. Otherwise the same computation as TRL
        1.16's ``GRPOTrainer._compute_loss`` for text models and the clipped loss types, with
        the per-token surrogate replaced by :func:`weighted_clipped_objective` (KL, vLLM
        importance-sampling correction, off-policy and entropy masks, aggregation and metrics
        as in TRL)."""
        if self.args.weighting == "none":
            return super()._compute_loss(model, inputs)
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        logits_to_keep = completion_ids.size(1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, logits_to_keep, compute_entropy=True)
        entropy_mask = (self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
                        if self.top_entropy_quantile < 1.0 else None)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        weights = inputs["adrpo_weights"]
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        if self.off_policy_mask_threshold is not None:
            off_policy_mask = self.get_off_policy_mask(
                advantages=advantages, per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old), mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold)
        log_ratio = per_token_logps - old
        if self.importance_sampling_level == "token":
            log_iw = log_ratio
        elif self.importance_sampling_level == "sequence":
            log_iw = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        else:
            raise ADRPOConfigError(f"unknown importance_sampling_level {self.importance_sampling_level!r}")
        coef_1 = torch.exp(log_iw)
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * coef_1
        per_token_loss = weighted_clipped_objective(
            coef_1, advantages, weights, epsilon_low=self.epsilon_low, epsilon_high=self.epsilon_high,
            weighting=self.args.weighting, delta=self.args.delta)
        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * off_policy_mask
        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        if self.beta != 0.0:
            per_token_loss = per_token_loss + self.beta * per_token_kl

        mode = "train" if self.model.training else "eval"
        accum = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        if self.loss_type == "dapo":
            num_items = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes
            if mode == "train":
                num_items = num_items * self.current_gradient_accumulation_steps / self.args.steps_per_generation
            loss = aggregate_loss(per_token_loss, mask, "dapo", max_completion_length=self.max_completion_length,
                                  num_items=num_items)
        else:
            loss = aggregate_loss(per_token_loss, mask, self.loss_type,
                                  max_completion_length=self.max_completion_length) / accum
        self._log_loss_metrics(mode, mask, entropies, coef_1, advantages, weights,
                               per_token_kl if self.beta != 0.0 else None)
        return loss

    def _log_loss_metrics(self, mode, mask, entropies, coef_1, advantages, weights, per_token_kl) -> None:
        """kl, entropy and clip ratios exactly as TRL logs them, plus ``adrpo/weight_mean``."""
        def masked_seq_mean(x):
            return x.squeeze(1) if x.shape[1] == 1 else (x * mask).sum(-1) / mask.sum(-1)

        def global_masked_mean(x):
            if x.shape[1] == 1:
                local_sum, count = x.sum(), torch.tensor(float(x.shape[0]), device=x.device)
            else:
                local_sum, count = (x * mask).sum(), mask.sum().float()
            totals = self.accelerator.reduce(torch.stack([local_sum, count]), reduction="sum")
            return (totals[0] / totals[1].clamp(min=1.0)).item()

        m = self._metrics[mode]
        if per_token_kl is not None:
            m["kl"].append(global_masked_mean(per_token_kl.detach()))
        m["entropy"].append(global_masked_mean(entropies))
        coef = coef_1.detach()
        low = (coef < 1 - self.epsilon_low) & (advantages < 0)
        high = (coef > 1 + self.epsilon_high) & (advantages > 0)
        m["clip_ratio/low_mean"].append(global_masked_mean(low.float()))
        m["clip_ratio/high_mean"].append(global_masked_mean(high.float()))
        m["clip_ratio/region_mean"].append(global_masked_mean((low | high).float()))
        m["clip_ratio/low_min"].append(nanmin(self.accelerator.gather(masked_seq_mean(low.float()))).item())
        m["clip_ratio/high_max"].append(nanmax(self.accelerator.gather(masked_seq_mean(high.float()))).item())
        m["adrpo/weight_mean"].append(self.accelerator.gather(weights.float()).mean().item())


# ---- building from a config -------------------------------------------------------------
def make_embedder(spec: str):
    """``minilm`` → the embedded all-MiniLM-L6-v2 (:class:`llm.embeddings.STEmbedder`, cached
    under $MEMGYM_CACHE); ``hash`` → :class:`llm.embeddings.HashEmbedder` (tests only); else a
    sentence-transformers dir. Raises FileNotFoundError for a missing dir."""
    from llm.embeddings import EmbeddingCache, HashEmbedder, STEmbedder
    from llm.paths import cache_dir

    if spec == "hash":
        return HashEmbedder(64)
    cache = EmbeddingCache(cache_dir() / "embeddings.sqlite")
    return STEmbedder(None if spec == "minilm" else spec, cache=cache)


def trajectory_paths(names: Sequence[str]) -> list[Path]:
    """Each name as a path, or looked up as ``$MEMGYM_DATA/expert/<name>.jsonl``
    (:func:`rewards.evaluate.resolve_expert_path`; FileNotFoundError naming both)."""
    from rewards.evaluate import resolve_expert_path

    return [resolve_expert_path(n) for n in names]


def build_reward(args: ADRPOConfig, tokenizer, embedder, rt=None) -> SessionReward:
    """The :class:`SessionReward` of ``args``: answer/judge backends loaded from their specs
    (with the sqlite response cache unless ``reward_cache: none``; ``rt``: a
    :class:`rewards.runtime.Runtime` already opened, else one is made here)."""
    from llm.base import GenerationParams
    from rewards.runtime import Runtime

    rt = rt or Runtime.from_config(cache=args.reward_cache)
    answer = rt.backend(args.answer_model, role="answer") if args.answer_model else None
    judge = rt.backend(args.judge_model, role="judge") if args.judge_model else None
    return SessionReward(args.reward_config(), embedder=embedder, tokenizer=tokenizer, answer_backend=answer,
                         judge_backend=judge,
                         answer_params=GenerationParams(max_new_tokens=args.answer_max_new_tokens, temperature=0))


def build_trainer(args: ADRPOConfig, callbacks=None) -> ADRPOTrainer:
    """Load the policy (``init_from`` or ``model_name_or_path``; LoRA per the config), build the
    reward samples from ``train_trajectories``, the reward, and the trainer."""
    from rewards.runtime import Runtime
    from rewards.samples import build_reward_samples
    from training.adrpo_data import select_samples
    from training.common import load_policy

    # files and caches first: a missing trajectory or a corrupt cache fails before the policy loads
    paths = trajectory_paths(args.train_trajectories)
    rt = Runtime.from_config(cache=args.reward_cache)
    embedder = make_embedder(args.embedder)
    policy = load_policy(args.init_from or args.model_name_or_path, args.use_peft, lora_r=args.lora_r,
                         lora_alpha=args.lora_alpha, lora_dropout=args.lora_dropout,
                         lora_target_modules=args.lora_target_modules, dtype=args.model_dtype)
    samples = build_reward_samples(paths, dataset=args.dataset,
                                   data_path=args.data_path, qa_path=args.qa_path, embedder=embedder,
                                   managers=args.managers)
    samples = select_samples(samples, sessions=args.sessions, max_prompt_tokens=args.max_prompt_tokens,
                             tokenizer=policy.tokenizer, whole_sessions=args.mode == "joint")
    logger.info("ADRPO: %d rows from %s", len(samples), args.train_trajectories)
    reward = build_reward(args, policy.tokenizer, embedder, rt)
    return ADRPOTrainer(policy.model, args=args, samples=samples, reward=reward, processing_class=policy.tokenizer,
                        peft_config=policy.peft_config, callbacks=callbacks)


def resume_arg(value):
    """``resume_from_checkpoint``: None/""/"false" → None, "true"/"last" → True (the last
    checkpoint in ``output_dir``), else the checkpoint dir."""
    if value is None or str(value).lower() in ("", "false", "none", "no"):
        return None
    return True if str(value).lower() in ("true", "last", "yes") else value


def train(args: ADRPOConfig, trainer: ADRPOTrainer | None = None) -> ADRPOTrainer:
    """Train (resuming when ``resume_from_checkpoint`` is set), then save the final model /
    adapter and tokenizer to ``output_dir``; ``trainer`` defaults to :func:`build_trainer`.
    Returns the trainer (its ``state.log_history`` holds every logged step)."""
    trainer = trainer if trainer is not None else build_trainer(args)
    trainer.train(resume_from_checkpoint=resume_arg(args.resume_from_checkpoint))
    trainer.save_model(args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(args.output_dir)
    return trainer


def main(argv: list[str] | None = None) -> int:
    """``python -m training.adrpo --config R.yaml [--field value ...]`` (``trl.TrlParser``: the
    recipe, then CLI overrides; on a machine without CUDA ``use_cpu``/``bf16 false`` come
    first). Returns 0, or 2 for a bad config or missing/broken data (the message names the
    field or file); errors during training propagate."""
    from training.common import parse_training_args

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    try:
        (args,) = parse_training_args([ADRPOConfig], argv, prog="memgym train adrpo",
                                      description="ADRPO: GRPO with dense session rewards and contribution-aware "
                                                  "weighting (TRL GRPOTrainer subclass).")
        trainer = build_trainer(args)
    except (ValueError, FileNotFoundError) as e:  # bad field, missing file, TrajectoryError, ADRPODataError, ...
        print(f"memgym train adrpo: {e}", file=sys.stderr)
        return 2
    train(args, trainer)
    last = next((h for h in reversed(trainer.state.log_history) if "reward" in h), {})
    summary = {k: round(v, 4) for k, v in last.items() if isinstance(v, (int, float)) and math.isfinite(v)
               and (k.startswith(("reward", "dominant", "frac_reward")) or k in ("kl", "step"))}
    print(f"memgym train adrpo: {trainer.state.global_step} steps, saved to {args.output_dir}; last step {summary}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
