"""The paper's Eq. 12 (``weighting: unclipped``) for the ablation: TRL 1.16's loss with the
per-token surrogate swapped, as TRL's gmpo / gspo-token trainers do.

Source: MemBuilder (arXiv 2601.05488) Eq. 12, analysed in docs/design.md § "Dense session reward and
ADRPO", step 7. With ρ the token's importance ratio, Â its
group-normalised advantage and w = w(m):

- ``none``: ``-min(ρÂ, clip(ρ, 1-ε_low, 1+ε_high)·Â)``;
- ``advantage``: ``-min(ρ·wÂ, clip(ρ)·wÂ)`` (trained by :class:`memgym.training.adrpo_trainer.ADRPOTrainer`);
- ``unclipped`` (Eq. 12): ``-min(w·ρÂ, clip(ρ)·Â)``.

:class:`ADRPOEq12Trainer` raises ValueError at construction for anything but TRL 1.16.x,
``loss_type`` grpo/bnpo/dr_grpo/dapo, text-only models, no entropy bonus, no router aux loss.
"""
from __future__ import annotations

import torch

from memgym.training.adrpo_config import WEIGHTINGS, ADRPOConfigError
from memgym.training.adrpo_trainer import ADRPOTrainer

def _as_column(x: torch.Tensor, name: str, batch: int) -> torch.Tensor:
    if x.dim() == 1:
        x = x.unsqueeze(1)
    if x.dim() != 2 or x.shape[0] != batch:
        raise ValueError(f"{name} must have shape ({batch},), ({batch}, 1) or ({batch}, T); got {tuple(x.shape)}")
    return x


def weighted_clipped_objective(ratio: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor | None, *,
                               epsilon_low: float, epsilon_high: float, weighting: str = "unclipped",
                               delta: float | None = None) -> torch.Tensor:
    """Per-token loss (before masking, KL and aggregation) of the three weightings.

    Args:
        ratio: ρ >= 0, (B, T) or (B, 1); carries the gradient.
        advantages: Â, (B,), (B, 1) or (B, T); constants.
        weights: w(m) > 0 per completion, (B,) or (B, 1); ``None`` = all 1.
        epsilon_low, epsilon_high: clip range [1-ε_low, 1+ε_high], each >= 0.
        weighting: ``advantage`` | ``unclipped`` | ``none``.
        delta: TRL's two-sided clipping cap on ρ.

    Returns the loss, (B, T) or (B, 1). Raises ValueError for an unknown weighting, bad shapes,
    negative epsilons or weights <= 0.
    """
    if weighting not in WEIGHTINGS:
        raise ValueError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if ratio.dim() != 2:
        raise ValueError(f"ratio must have shape (B, T) or (B, 1); got {tuple(ratio.shape)}")
    if epsilon_low < 0 or epsilon_high < 0:
        raise ValueError(f"clip epsilons must be >= 0, got low={epsilon_low}, high={epsilon_high}")
    batch = ratio.shape[0]
    adv = _as_column(advantages, "advantages", batch).to(ratio.dtype)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    unclipped = torch.clamp(ratio, max=delta) if delta is not None else ratio
    if weighting == "none" or weights is None:
        return -torch.min(unclipped * adv, clipped * adv)
    w = _as_column(weights, "weights", batch).to(ratio.dtype)
    if w.shape[1] != 1:
        raise ValueError(f"weights are per completion: shape ({batch},) or ({batch}, 1); got {tuple(w.shape)}")
    if not bool(torch.all(w > 0)):
        raise ValueError(f"weights must be > 0, got min {float(w.min())}")
    if weighting == "advantage":
        return -torch.min(unclipped * w * adv, clipped * w * adv)
    return -torch.min(w * unclipped * adv, clipped * adv)


def check_eq12_model(*, is_vlm: bool, aux_loss: bool) -> None:
    """Raise :class:`ADRPOConfigError` for a loaded model the Eq. 12 loss does not support: a vision
    model, or one with the router aux loss on (the settings' limits: ``check_eq12_support``)."""
    if is_vlm:
        raise ADRPOConfigError("weighting: unclipped is implemented for text-only models")
    if aux_loss:
        raise ADRPOConfigError("weighting: unclipped does not support the router aux loss (router_aux_loss_coef: 0)")


class ADRPOEq12Trainer(ADRPOTrainer):
    """:class:`ADRPOTrainer` with the paper's Eq. 12 loss (``weighting: unclipped`` only).
    Same arguments; raises :class:`ADRPOConfigError` for any other weighting or a setting
    outside the limits of the module docstring."""

    def __init__(self, model, *, args, **kwargs):
        if getattr(args, "weighting", None) != "unclipped":
            raise ADRPOConfigError(f"ADRPOEq12Trainer is the weighting: unclipped ablation; got weighting "
                                   f"{getattr(args, 'weighting', None)!r} (use ADRPOTrainer)")
        super().__init__(model, args=args, **kwargs)  # ADRPOConfig checked the settings (check_eq12_support)
        check_eq12_model(is_vlm=self._is_vlm, aux_loss=self.aux_loss_enabled)

    def _compute_loss(self, model, inputs):
        """TRL 1.16's ``GRPOTrainer._compute_loss`` for text models and the clipped loss types,
        with the per-token surrogate replaced by Eq. 12 (:func:`weighted_clipped_objective`)."""
        prompt_ids, prompt_mask = inputs["prompt_ids"], inputs["prompt_mask"]
        completion_ids, completion_mask = inputs["completion_ids"], inputs["completion_mask"]
        input_ids = torch.cat([prompt_ids, completion_ids], dim=1)
        attention_mask = torch.cat([prompt_mask, completion_mask], dim=1)
        mask = completion_mask if "tool_mask" not in inputs else completion_mask * inputs["tool_mask"]
        per_token_logps, entropies, _ = self._get_per_token_logps_and_entropies(
            model, input_ids, attention_mask, completion_ids.size(1), compute_entropy=True)
        entropy_mask = (self.get_high_entropy_mask(entropies, mask, 1 - self.top_entropy_quantile)
                        if self.top_entropy_quantile < 1.0 else None)
        advantages = inputs["advantages"]
        if advantages.dim() == 1:
            advantages = advantages.unsqueeze(1)
        old = inputs.get("old_per_token_logps")
        old = per_token_logps.detach() if old is None else old
        log_ratio = per_token_logps - old
        if self.importance_sampling_level == "sequence":
            log_ratio = ((log_ratio * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)).unsqueeze(-1)
        coef_1 = torch.exp(log_ratio)
        per_token_loss = weighted_clipped_objective(
            coef_1, advantages, inputs["adrpo_weights"], epsilon_low=self.epsilon_low,
            epsilon_high=self.epsilon_high, weighting="unclipped", delta=self.args.delta)
        if self.off_policy_mask_threshold is not None:
            per_token_loss = per_token_loss * self.get_off_policy_mask(
                advantages=advantages, per_token_logps=per_token_logps,
                sampling_per_token_logps=inputs.get("sampling_per_token_logps", old), mask=mask,
                off_policy_threshold=self.off_policy_mask_threshold)
        if entropy_mask is not None:
            per_token_loss = per_token_loss * entropy_mask
        if self.use_vllm and self.vllm_importance_sampling_correction:
            per_token_loss = per_token_loss * inputs["importance_sampling_ratio"]
        mode = "train" if self.model.training else "eval"
        if self.beta != 0.0:
            ref = inputs["ref_per_token_logps"]
            per_token_kl = torch.exp(ref - per_token_logps) - (ref - per_token_logps) - 1
            if self.args.use_bias_correction_kl:
                per_token_kl = per_token_kl * coef_1
            per_token_loss = per_token_loss + self.beta * per_token_kl
            self._metrics[mode]["kl"].append(self._global_masked_mean(per_token_kl.detach(), mask))
        self._metrics[mode]["entropy"].append(self._global_masked_mean(entropies, mask))
        accum = self.current_gradient_accumulation_steps if mode == "train" else 1.0
        masked = per_token_loss * mask
        if self.loss_type == "grpo":
            return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean() / accum
        if self.loss_type == "bnpo":
            return masked.sum() / mask.sum().clamp(min=1.0) / accum
        if self.loss_type == "dr_grpo":
            return masked.sum() / (per_token_loss.size(0) * self.max_completion_length) / accum
        num_items = inputs["num_items_in_batch"].clamp(min=1.0) / self.accelerator.num_processes  # dapo
        if mode == "train":
            num_items = num_items * self.current_gradient_accumulation_steps / self.args.steps_per_generation
        return masked.sum() / num_items

    def _global_masked_mean(self, x: torch.Tensor, mask: torch.Tensor) -> float:
        local = torch.stack([(x * mask).sum(), mask.sum().float()])
        total = self.accelerator.reduce(local, reduction="sum")
        return (total[0] / total[1].clamp(min=1.0)).item()
