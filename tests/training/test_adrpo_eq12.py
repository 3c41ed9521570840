"""The per-token objective of ADRPO and of the Eq. 12 ablation
(:func:`memgym.training.adrpo_eq12.weighted_clipped_objective`): the gradient of one token,
hand-computed, for every weighting, inside and outside the clipping band."""
from __future__ import annotations

import math

import pytest
import torch

from memgym.training.adrpo_eq12 import weighted_clipped_objective

EPS = 0.2
ALPHA = 4.0


def token_grad(weighting: str, adv: float, ratio: float, w: float) -> float:
    """d L_tok / d log π_θ(token) for one token with old log-prob 0, so ρ = exp(log π_θ)."""
    logp = torch.tensor([[math.log(ratio)]], dtype=torch.float64, requires_grad=True)
    loss = weighted_clipped_objective(torch.exp(logp), torch.tensor([adv], dtype=torch.float64),
                                      torch.tensor([w], dtype=torch.float64), epsilon_low=EPS, epsilon_high=EPS,
                                      weighting=weighting)
    loss.sum().backward()
    return float(logp.grad.item())


# ---- gradient of one token ---------------------------------------------------------------
@pytest.mark.parametrize("ratio", [0.85, 1.0, 1.1, 1.19])
def test_positive_advantage_in_band_advantage_weighting_scales_by_alpha_unclipped_does_not(ratio):
    # inside the band the surrogate is ρ·Â, so dL/dlogπ = -ρ·Â (×w when Â is weighted)
    stock = token_grad("none", 0.5, ratio, ALPHA)
    assert stock == pytest.approx(-0.5 * ratio, rel=1e-12)
    assert token_grad("advantage", 0.5, ratio, ALPHA) == pytest.approx(ALPHA * stock, rel=1e-12)
    # Eq. 12: min(w·ρÂ, clip(ρ)Â) picks the clipped term ρÂ for Â > 0: the weight is inert
    assert token_grad("unclipped", 0.5, ratio, ALPHA) == pytest.approx(stock, rel=1e-12)


@pytest.mark.parametrize("ratio", [0.85, 1.0, 1.1, 1.19])
def test_negative_advantage_in_band_both_weightings_scale_by_alpha(ratio):
    stock = token_grad("none", -0.5, ratio, ALPHA)
    assert stock == pytest.approx(0.5 * ratio, rel=1e-12)
    assert token_grad("advantage", -0.5, ratio, ALPHA) == pytest.approx(ALPHA * stock, rel=1e-12)
    # for Â < 0 the min picks w·ρÂ (the more negative term): penalties are amplified
    assert token_grad("unclipped", -0.5, ratio, ALPHA) == pytest.approx(ALPHA * stock, rel=1e-12)


@pytest.mark.parametrize("weighting", ["none", "advantage", "unclipped"])
@pytest.mark.parametrize("adv,ratio", [(0.5, 1.1), (-0.5, 1.1), (0.5, 0.7), (-0.5, 1.3)])
def test_non_dominant_token_weight_one_is_stock_grpo(weighting, adv, ratio):
    assert token_grad(weighting, adv, ratio, 1.0) == pytest.approx(token_grad("none", adv, ratio, 1.0), rel=1e-12)


@pytest.mark.parametrize("adv,ratio,expected", [
    # (Â, ρ) -> (none, advantage, unclipped), hand-computed with ε = 0.2, w = 4
    (0.5, 1.3, (0.0, 0.0, 0.0)),          # Â>0 above the band: clipped for all
    (0.5, 0.7, (-0.35, -1.4, 0.0)),       # Â>0 below: Eq. 12 picks the constant 0.8·Â (w·ρ = 2.8 > 0.8)
    (0.5, 0.15, (-0.075, -0.3, -0.3)),    # Â>0, w·ρ = 0.6 < 0.8: Eq. 12 picks w·ρÂ
    (-0.5, 0.7, (0.0, 0.0, 1.4)),         # Â<0 below: stock clips; Eq. 12 keeps pushing (w·ρ >= 0.8)
    (-0.5, 1.3, (0.65, 2.6, 2.6)),        # Â<0 above: never clipped, weighted by both
])
def test_outside_the_band(adv, ratio, expected):
    got = tuple(token_grad(w, adv, ratio, ALPHA) for w in ("none", "advantage", "unclipped"))
    assert got == pytest.approx(expected, abs=1e-12)


def test_advantage_weighting_is_stock_loss_with_scaled_advantages():
    g = torch.Generator().manual_seed(0)
    ratio = torch.exp(0.3 * torch.randn(3, 5, generator=g, dtype=torch.float64))
    adv = torch.tensor([1.5, -0.7, 0.2], dtype=torch.float64)
    w = torch.tensor([4.0, 1.0, 4.0], dtype=torch.float64)
    ours = weighted_clipped_objective(ratio, adv, w, epsilon_low=0.2, epsilon_high=0.28, weighting="advantage")
    stock = weighted_clipped_objective(ratio, adv * w, None, epsilon_low=0.2, epsilon_high=0.28, weighting="none")
    assert torch.equal(ours, stock)
    # delta (two-sided clipping) caps ρ in the unclipped term: ρ = 3, Â = -1 → -min(2·-1, 1.2·-1) = 2
    one = weighted_clipped_objective(torch.tensor([[3.0]]), torch.tensor([-1.0]), torch.tensor([1.0]),
                                     epsilon_low=0.2, epsilon_high=0.2, weighting="advantage", delta=2.0)
    assert one.item() == pytest.approx(2.0)


def test_objective_rejects_bad_input():
    r = torch.ones(2, 3)
    with pytest.raises(ValueError, match="weighting"):
        weighted_clipped_objective(r, torch.ones(2), torch.ones(2), epsilon_low=0.2, epsilon_high=0.2, weighting="x")
    with pytest.raises(ValueError, match="weights must be > 0"):
        weighted_clipped_objective(r, torch.ones(2), torch.tensor([1.0, 0.0]), epsilon_low=0.2, epsilon_high=0.2)
    with pytest.raises(ValueError, match=r"advantages must have shape \(2,\)"):
        weighted_clipped_objective(r, torch.ones(3), torch.ones(2), epsilon_low=0.2, epsilon_high=0.2)
