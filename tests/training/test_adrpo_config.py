"""ADRPO's recipe checks (:mod:`memgym.training.adrpo_config`): the weighting, the Eq. 12 limits,
the reward section, the checks across sections and the batch divisibility message."""
from __future__ import annotations

import pytest


def _cfg(tmp_path, **kw):
    from memgym.training.adrpo_config import ADRPOConfig

    base = dict(output_dir=str(tmp_path / "out"), use_cpu=True, bf16=False, report_to="none",
                activation_checkpointing=False)
    return ADRPOConfig(**{**base, **kw})


def test_config_checks(tmp_path):
    from memgym.llm.errors import ConfigError
    from memgym.rewards.reward_types import SessionRewardConfig
    from memgym.training.adrpo import main, parse_args
    from memgym.training.adrpo_config import ADRPOConfigError, ADRPOScriptArguments, check_eq12_support, check_recipe
    from memgym.training.adrpo_eq12 import check_eq12_model

    _, rc, cfg, _ = parse_args(["--output_dir", str(tmp_path / "p"), "--loss_type", "grpo", "--mode", "isolated",
                                "--retrieval_top_k", "5", "--alpha", "2.0", "--top_k", "7"])
    assert (rc.mode, rc.retrieval_top_k, rc.alpha, rc.judge, rc.lam) == ("isolated", 5, 2.0, "answer-recall", 0.8)
    assert (cfg.loss_type, cfg.top_k) == ("grpo", 7)  # TRL's sampling top_k stays TRL's
    with pytest.raises(ADRPOConfigError, match="weighting"):
        _cfg(tmp_path, weighting="clipped")
    # advantage weighting runs on TRL's own loss, so every loss type and the entropy bonus work
    assert _cfg(tmp_path, loss_type="sapo").loss_type == "sapo"
    assert _cfg(tmp_path, entropy_coef=0.01).entropy_coef == 0.01
    # the Eq. 12 ablation has its own loss and its limits
    with pytest.raises(ADRPOConfigError, match="loss_type 'sapo'"):
        _cfg(tmp_path, loss_type="sapo", weighting="unclipped")
    with pytest.raises(ADRPOConfigError, match="entropy"):
        _cfg(tmp_path, entropy_coef=0.01, weighting="unclipped")
    check_eq12_support(_cfg(tmp_path, loss_type="bnpo", weighting="unclipped"))
    with pytest.raises(ADRPOConfigError, match="text-only"):
        check_eq12_model(is_vlm=True, aux_loss=False)
    with pytest.raises(ADRPOConfigError, match="router aux loss"):
        check_eq12_model(is_vlm=False, aux_loss=True)
    with pytest.raises(ValueError, match="lam"):
        SessionRewardConfig(lam=1.5)
    assert main(["--output_dir", str(tmp_path / "o"), "--weighting", "clipped"]) == 2
    assert main(["--output_dir", str(tmp_path / "o"), "--lam", "1.5"]) == 2
    # segment rows: their QA come from the trajectories by evidence turn, one manager at a time
    assert ADRPOScriptArguments(segment_tokens=200).segment_tokens == 200
    with pytest.raises(ADRPOConfigError, match="segment_tokens.*mode counterfactual or isolated"):
        check_recipe(ADRPOScriptArguments(segment_tokens=200), SessionRewardConfig(mode="joint"))
    check_recipe(ADRPOScriptArguments(segment_tokens=200), SessionRewardConfig(mode="isolated"))
    with pytest.raises(ADRPOConfigError, match="unset qa_path"):
        ADRPOScriptArguments(segment_tokens=200, qa_path="qa.jsonl")
    with pytest.raises(ADRPOConfigError, match="segment_tokens"):
        ADRPOScriptArguments(segment_tokens=0)
    with pytest.raises(ConfigError, match=r"SessionRewardConfig\.mode must be one of"):
        SessionRewardConfig(mode="both")


def test_each_setting_has_one_home_and_the_recipes_keys_still_parse(tmp_path):
    """The reward's settings are one section (no field of it mirrored in another), and a recipe's
    reward keys land in it."""
    import dataclasses

    from memgym.training.adrpo import CONFIG_TYPES, parse_args

    names = [f.name for t in CONFIG_TYPES for f in dataclasses.fields(t)]
    assert len(names) == len(set(names))
    recipe = tmp_path / "r.yaml"
    recipe.write_text("output_dir: o\nlam: 0.5\ncore_lp_lo: 20\ncore_lp_hi: 60\nsegment_tokens: 200\n"
                      "retrieval_top_k: 3\nweighting: none\nnum_generations: 4\nper_device_train_batch_size: 4\n")
    script, reward, cfg, _ = parse_args(["--config", str(recipe)])
    assert (reward.lam, reward.core_lp_lo, reward.core_lp_hi, reward.retrieval_top_k) == (0.5, 20, 60, 3)
    assert (script.segment_tokens, cfg.weighting, cfg.num_generations) == (200, "none", 4)


def test_adrpo_divisibility_names_the_flags_the_user_set(tmp_path):
    from memgym.training.adrpo_config import ADRPOConfig, ADRPOConfigError

    with pytest.raises(ADRPOConfigError) as e:
        ADRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                    per_device_train_batch_size=3, gradient_accumulation_steps=1, num_generations=2)
    msg = str(e.value)
    assert "per_device_train_batch_size (3)" in msg and "num_generations (2)" in msg
    assert "--gradient_accumulation_steps" in msg


def test_core_length_thresholds_reach_the_reward(tmp_path):
    """core_lp_lo / core_lp_hi (MemBuilder Eq. 7) pass from the ADRPO recipe into the session
    reward: 175 written tokens cost LP (175 - 150) / 250 = 0.1 at the paper's 150 / 400 and
    (175 - 100) / 150 = 0.5 at 100 / 250, so R = 1 - 0.8 * LP = 0.92 and 0.6."""
    import json

    from memgym.llm.embeddings import HashEmbedder
    from memgym.llm.errors import ConfigError
    from memgym.rewards.session_reward import SessionReward
    from memgym.training.adrpo import parse_args
    from tests.helpers import DOG, WordTokenizer, bank_with, make_samples, qa

    samples = make_samples(bank_with(1, episodic=[DOG]), 2, {},
                           [qa("What is the name of the dog Alice adopted?", "Biscuit")], managers=["core"])
    out = json.dumps({"operation": "APPEND", "content": " ".join(["w"] * 175)})
    for flags, lp in (([], 0.1), (["--core_lp_lo", "100", "--core_lp_hi", "250"], 0.5)):
        _, rc, _, _ = parse_args(["--output_dir", str(tmp_path / "o"), *flags])
        (b,) = SessionReward(rc, embedder=HashEmbedder(512), tokenizer=WordTokenizer())(samples, [out])
        assert (b.length_tokens, b.acc) == (175, 1.0)
        assert b.lp == pytest.approx(lp) and b.reward == pytest.approx(1.0 - 0.8 * lp)
    with pytest.raises(ConfigError, match=r"SessionRewardConfig\.core_lp_lo must be 0 <= core_lp_lo < core_lp_hi"):
        parse_args(["--output_dir", str(tmp_path / "o"), "--core_lp_lo", "300", "--core_lp_hi", "250"])


def test_copy_penalty_reaches_the_reward(tmp_path):
    """copy_penalty / copy_ngram pass from the ADRPO recipe into the session reward (default off,
    MemBuilder's reward); out of range names the reward's field."""
    from memgym.llm.errors import ConfigError
    from memgym.training.adrpo import parse_args

    _, rc, _, _ = parse_args(["--output_dir", str(tmp_path / "o")])
    assert (rc.copy_penalty, rc.copy_ngram) == (0.0, 6)
    _, rc, _, _ = parse_args(["--output_dir", str(tmp_path / "o"), "--copy_penalty", "0.5", "--copy_ngram", "8"])
    assert (rc.copy_penalty, rc.copy_ngram) == (0.5, 8)
    with pytest.raises(ConfigError, match=r"SessionRewardConfig\.copy_penalty must be in \[0, 1\], got -0.1"):
        parse_args(["--output_dir", str(tmp_path / "o"), "--copy_penalty", "-0.1"])
