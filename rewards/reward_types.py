"""The dense session reward's settings (:class:`SessionRewardConfig`), result
(:class:`RewardBreakdown`), error type and bank :data:`MODES`. Source: MemBuilder (arXiv
2601.05488) §3.4, Eqs. 5-10; steps in brackets refer to :mod:`memgym.rewards.session_reward`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from memgym.llm.errors import ConfigError, MemgymError
from memgym.memory_bank.actions import PARTS
from memgym.rewards.scoring.scorers import SCORER_NAMES

__all__ = ["MODES", "SessionRewardConfig", "RewardBreakdown", "RewardDataError"]

MODES = ("counterfactual", "isolated", "joint")


class RewardDataError(MemgymError, ValueError):
    """A reward sample whose expert data is inconsistent (an expert output that does not
    apply to its own bank). Names the sample key and manager."""

    kind = "data"


@dataclass
class SessionRewardConfig:
    """Reward settings (steps in brackets); one section of the ADRPO recipe (``trl.TrlParser`` fills
    it beside the trainer config, so every field is a recipe key and a ``--flag``).

    mode [2]: counterfactual | isolated | joint. judge [3]: answer-recall | f1 | llm.
    lam [5]: λ in [0, 1]. alpha [6]: α > 0. attribution_on [6]: all | correct.
    retrieval_top_k [3]: entries retrieved per question (>= 1). core_lp_lo / core_lp_hi, band_abs_tokens,
    band_lo, band_hi, r_min, r_max [4]: length thresholds (tokens / ratios).
    correct_threshold in [0, 1]. copy_penalty: μ in [0, 1] (0 = MemBuilder's reward);
    copy_ngram: CP's n-gram length (>= 2). Raises :class:`memgym.llm.errors.ConfigError` (a
    ValueError) naming an out-of-range field.
    """

    _argument_group_name = "SessionRewardConfig: the dense session reward (memgym.rewards.session_reward)"

    mode: str = field(default="counterfactual", metadata={"help": "counterfactual | isolated | joint"})
    judge: str = field(default="answer-recall", metadata={"help": "answer-recall | f1 | llm"})
    lam: float = field(default=0.8, metadata={"help": "length-penalty weight λ in [0, 1]"})
    alpha: float = field(default=4.0, metadata={"help": "w(m) of the dominant part (> 0); others get 1"})
    attribution_on: str = field(default="all", metadata={"help": "all | correct questions count for h(m)"})
    retrieval_top_k: int = field(default=10, metadata={
        "help": "entries retrieved per question (TRL's top_k is the sampling top-k)"})
    core_lp_lo: int = field(default=150, metadata={
        "help": "core length penalty: 0 up to this many written tokens (MemBuilder Eq. 7, theta_min = 150 for a "
                "whole session)"})
    core_lp_hi: int = field(default=400, metadata={
        "help": "core length penalty: 1 from this many written tokens on (MemBuilder Eq. 7, theta_max = 400); "
                "segment rows write far less per call, see scripts/experiments/train_cpu/adrpo.yaml"})
    band_abs_tokens: int = field(default=200, metadata={
        "help": "part length penalty: 0 within this many tokens of the expert's output (MemBuilder Eq. 8)"})
    band_lo: float = field(default=0.5, metadata={"help": "part length penalty: 0 from this length ratio ..."})
    band_hi: float = field(default=1.3, metadata={"help": "... to this one (MemBuilder Eq. 8)"})
    r_min: float = field(default=0.2, metadata={"help": "part length penalty: 1 at this ratio and below"})
    r_max: float = field(default=2.0, metadata={"help": "part length penalty: 1 at this ratio and above"})
    correct_threshold: float = field(default=0.5, metadata={"help": "score >= this counts a question correct"})
    copy_penalty: float = field(default=0.0, metadata={
        "help": "mu in [0, 1]: R x (1 - mu * CP), CP the share of the core output's words in a copy_ngram-word run "
                "copied verbatim from the transcript (memgym.rewards.copying; memgym's correction, 0 = MemBuilder's reward)"})
    copy_ngram: int = field(default=6, metadata={"help": "n-gram length in words of the copy rate (>= 2)"})

    def __post_init__(self):
        checks = [
            ("mode", self.mode in MODES, f"one of {MODES}"),
            ("judge", self.judge in SCORER_NAMES, f"one of {SCORER_NAMES}"),
            ("lam", 0.0 <= self.lam <= 1.0, "in [0, 1]"),
            ("alpha", self.alpha > 0, "> 0"),
            ("attribution_on", self.attribution_on in ("all", "correct"), "all or correct"),
            ("retrieval_top_k", isinstance(self.retrieval_top_k, int) and self.retrieval_top_k >= 1, "an int >= 1"),
            ("core_lp_lo", 0 <= self.core_lp_lo < self.core_lp_hi, "0 <= core_lp_lo < core_lp_hi"),
            ("band_abs_tokens", self.band_abs_tokens >= 0, ">= 0"),
            ("band_lo", 0 <= self.r_min < self.band_lo <= self.band_hi < self.r_max,
             "0 <= r_min < band_lo <= band_hi < r_max"),
            ("correct_threshold", 0.0 <= self.correct_threshold <= 1.0, "in [0, 1]"),
            ("copy_penalty", 0.0 <= self.copy_penalty <= 1.0, "in [0, 1]"),
            ("copy_ngram", isinstance(self.copy_ngram, int) and self.copy_ngram >= 2, "an int >= 2"),
        ]
        for name, ok, need in checks:
            if not ok:
                raise ConfigError(f"SessionRewardConfig.{name} must be {need}, got {getattr(self, name)!r}")


@dataclass
class RewardBreakdown:
    """Every part of one reward: reward = gate · acc · (1 − λ·lp) · (1 − μ·copy), in [0, 1].

    gate 0/1; acc, lp, copy in [0, 1]; length_tokens / expert_length_tokens in policy tokens;
    dominant: episodic | semantic | procedural | None; weight: w(m); counts: retrieved entries
    per part; error_type: the format error or None; correct: per question, score >= threshold.
    """

    reward: float
    gate: int
    acc: float
    lp: float
    length_tokens: int
    expert_length_tokens: int
    dominant: str | None
    weight: float
    counts: dict[str, int]
    error_type: str | None
    mode: str
    correct: list[bool] = field(default_factory=list)
    copy: float = 0.0

    def to_log(self) -> dict:
        """Flat ``{name: float}`` for trainer logging: reward, gate, acc, lp, length_tokens,
        expert_length_tokens, weight, frac_correct, format_error, copy, ``dominant/<part|none>``
        (one-hot) and ``retrieved/<part>``."""
        out = {"reward": float(self.reward), "gate": float(self.gate), "acc": float(self.acc), "lp": float(self.lp),
               "length_tokens": float(self.length_tokens), "expert_length_tokens": float(self.expert_length_tokens),
               "weight": float(self.weight),
               "frac_correct": float(np.mean(self.correct)) if self.correct else 0.0,
               "format_error": float(self.error_type is not None), "copy": float(self.copy)}
        for p in PARTS + ("none",):
            out[f"dominant/{p}"] = float((self.dominant or "none") == p)
        for p in PARTS:
            out[f"retrieved/{p}"] = float(self.counts.get(p, 0))
        return out
