"""The ADRPO per-token objective with contribution-aware weights, and its batch aggregation.

Source: ``DESIGN.md`` § "Dense session reward and ADRPO", step 7, and the MemBuilder review
(``../shared/seeds/004_2e899ffbe394021e.txt``) of arXiv 2601.05488, Eq. 12. With the
importance ratio ρ = π_θ(y_t | ·) / π_old(y_t | ·) of one completion token, its (group-normalised)
advantage Â and the weight w = w(m) of the completion's manager m (α for the dominant part,
else 1), the per-token losses are:

- ``advantage`` (the corrected form we train with)::

      L_tok = -min(ρ · wÂ, clip(ρ, 1-ε_low, 1+ε_high) · wÂ)

  i.e. PPO's clipped surrogate with the advantage scaled by w; because w > 0 the clip
  region is unchanged and the gradient of every unclipped token is exactly w times the stock
  one, for both signs of Â (the paper's stated intent).
- ``unclipped`` (the paper's Eq. 12, kept for the ablation)::

      L_tok = -min(w · ρÂ, clip(ρ, 1-ε_low, 1+ε_high) · Â)

  For Â > 0 and ρ in [1-ε_low, 1+ε_high] the min picks the clipped term, so w has no effect
  (the defect the review points out); for Â > 0 and ρ < (1-ε_low)/w it is w times stock, and
  for Â > 0, (1-ε_low)/w <= ρ < 1-ε_low the gradient is 0 where stock PPO's is not. For
  Â < 0 the min picks w·ρÂ whenever w·ρ >= clip(ρ): gradients are w times stock inside the
  band and above it, and even below 1-ε_low down to ρ = (1-ε_low)/w, where stock PPO clips.
- ``none``: stock GRPO/PPO, ``-min(ρÂ, clip(ρ)Â)``.

The KL penalty β·KL is added by the trainer after this objective and is not weighted.
Shapes: ``ratio`` is (B, T) (token-level importance sampling) or (B, 1) (sequence level);
``advantages`` is (B,), (B, 1) or (B, T); ``weights`` is (B,) or (B, 1). The result broadcasts
to (B, T) or (B, 1).
"""
from __future__ import annotations

import torch

WEIGHTINGS = ("advantage", "unclipped", "none")
# loss types of TRL 1.16's GRPOTrainer that share the clipped per-token surrogate -min(ρA, clip(ρ)A)
# and differ only in how the per-token losses are averaged (see aggregate_loss)
SUPPORTED_LOSS_TYPES = ("grpo", "bnpo", "dr_grpo", "dapo")


class ADRPOLossError(ValueError):
    """A bad argument to the ADRPO loss (unknown weighting or loss type, bad shapes/values)."""


def _as_column(x: torch.Tensor, name: str, batch: int) -> torch.Tensor:
    if x.dim() == 1:
        x = x.unsqueeze(1)
    if x.dim() != 2 or x.shape[0] != batch:
        raise ADRPOLossError(f"{name} must have shape ({batch},), ({batch}, 1) or ({batch}, T); got {tuple(x.shape)}")
    return x


def weighted_clipped_objective(ratio: torch.Tensor, advantages: torch.Tensor, weights: torch.Tensor | None, *,
                               epsilon_low: float, epsilon_high: float, weighting: str = "advantage",
                               delta: float | None = None) -> torch.Tensor:
    """Per-token ADRPO loss (before masking, KL and aggregation); see the module docstring.

    Args:
        ratio: importance ratio ρ >= 0, (B, T) or (B, 1); carries the gradient.
        advantages: Â, (B,), (B, 1) or (B, T); treated as constants.
        weights: w(m) > 0 per completion, (B,) or (B, 1); ``None`` means all 1.
        epsilon_low, epsilon_high: the clip range [1-ε_low, 1+ε_high] (TRL's ``epsilon`` and
            ``epsilon_high``), each >= 0.
        weighting: ``advantage`` | ``unclipped`` | ``none``.
        delta: TRL's two-sided clipping (INTELLECT-2): ρ in the unclipped term is capped at
            ``delta`` when given.

    Returns the per-token loss, broadcast of the inputs' shapes, (B, T) or (B, 1).
    Raises :class:`ADRPOLossError` for an unknown weighting, bad shapes, or weights <= 0.
    """
    if weighting not in WEIGHTINGS:
        raise ADRPOLossError(f"weighting must be one of {WEIGHTINGS}, got {weighting!r}")
    if ratio.dim() != 2:
        raise ADRPOLossError(f"ratio must have shape (B, T) or (B, 1); got {tuple(ratio.shape)}")
    if epsilon_low < 0 or epsilon_high < 0:
        raise ADRPOLossError(f"clip epsilons must be >= 0, got low={epsilon_low}, high={epsilon_high}")
    batch = ratio.shape[0]
    adv = _as_column(advantages, "advantages", batch).to(ratio.dtype)
    clipped = torch.clamp(ratio, 1 - epsilon_low, 1 + epsilon_high)
    unclipped = torch.clamp(ratio, max=delta) if delta is not None else ratio
    if weighting == "none" or weights is None:
        return -torch.min(unclipped * adv, clipped * adv)
    w = _as_column(weights, "weights", batch).to(ratio.dtype)
    if w.shape[1] != 1:
        raise ADRPOLossError(f"weights are per completion: shape ({batch},) or ({batch}, 1); got {tuple(w.shape)}")
    if not bool(torch.all(w > 0)):
        raise ADRPOLossError(f"weights must be > 0, got min {float(w.min())}")
    if weighting == "advantage":
        wa = w * adv
        return -torch.min(unclipped * wa, clipped * wa)
    return -torch.min(w * unclipped * adv, clipped * adv)  # "unclipped": the paper's Eq. 12


def aggregate_loss(per_token_loss: torch.Tensor, mask: torch.Tensor, loss_type: str, *,
                   max_completion_length: int, num_items: float | None = None) -> torch.Tensor:
    """Average the masked per-token loss the way TRL 1.16's ``GRPOTrainer`` does for
    ``loss_type`` (before gradient-accumulation scaling, which the trainer applies):

    - ``grpo``: mean over sequences of each sequence's token mean (Shao et al. 2024, DeepSeekMath);
    - ``bnpo``: sum over all tokens / number of completion tokens in the micro-batch;
    - ``dr_grpo``: sum over all tokens / (B · ``max_completion_length``) (Liu et al. 2025, Dr. GRPO);
    - ``dapo``: sum over all tokens / ``num_items`` (completion tokens of the whole generation
      batch, already rescaled by the caller; Yu et al. 2025, DAPO).

    ``per_token_loss`` (B, T) or (B, 1); ``mask`` (B, T) of 0/1. Returns a scalar tensor.
    Raises :class:`ADRPOLossError` for a loss type outside :data:`SUPPORTED_LOSS_TYPES` or a
    ``dapo`` call without ``num_items``.
    """
    masked = per_token_loss * mask
    if loss_type == "grpo":
        return (masked.sum(-1) / mask.sum(-1).clamp(min=1.0)).mean()
    if loss_type == "bnpo":
        return masked.sum() / mask.sum().clamp(min=1.0)
    if loss_type == "dr_grpo":
        return masked.sum() / (per_token_loss.size(0) * max_completion_length)
    if loss_type == "dapo":
        if num_items is None:
            raise ADRPOLossError("loss_type 'dapo' needs num_items (completion tokens in the generation batch)")
        return masked.sum() / num_items
    raise ADRPOLossError(f"loss_type {loss_type!r} is not supported by ADRPO weighting; "
                         f"use one of {SUPPORTED_LOSS_TYPES} (or weighting: none for any TRL loss type)")
