"""ADRPO end to end on a tiny policy: the trainer against stock TRL (every loss type), two real
TRL steps + resume, and the recipes and command. The per-token objectives, the config checks,
the sampler and the reward function have their own files (test_adrpo_eq12, test_adrpo_config,
test_adrpo_data, test_adrpo_trainer).

The tiny policy is the ``tiny_model_dir`` fixture (random weights, SmolLM2's tokenizer) with a
planted bigram path "\\n" → '{"' → 'operations' → '":' → ' []' → '}' → EOS (fixture
``planted_dir``, :func:`tests.helpers.planted_policy`): a purely random model never writes a valid
manager output, so every reward would be 0 and GRPO would have no signal. With the plant, sampling at temperature 1
writes the valid episodic output ``{"operations": []}`` about half of the time.
"""
from __future__ import annotations

import dataclasses
import math

import pytest
import torch

from tests.helpers import trainable_state

ALPHA = 4.0


# ---- real TRL steps on a tiny planted policy (tests.helpers.planted_policy) ------------------
@pytest.fixture(scope="module")
def short_samples():
    """The 4 real conv-26 session-1 reward samples (expert bank before the session, expert
    outputs, 5 QA) with a one-line prompt: the planted policy ignores its context, and on CPU
    TRL scores every prompt position against the 49K-token vocabulary, so long prompts only
    cost time here."""
    from memgym.llm.embeddings import HashEmbedder
    from memgym.training.reward_rows import build_rows

    samples = [s for s in build_rows(["conv-26"], embedder=HashEmbedder(64)) if s.session == 1]
    return [dataclasses.replace(s, messages=[{"role": "user", "content": f"Output the JSON for the {s.manager} part."}])
            for s in samples]


def _trainer(policy_dir, samples, out, **kw):
    from memgym.llm.embeddings import HashEmbedder
    from memgym.rewards.session_reward import SessionReward
    from memgym.training.adrpo import trainer_class
    from memgym.training.adrpo_config import ADRPOConfig
    from memgym.training.common import PolicyModelConfig, load_policy

    policy = load_policy(PolicyModelConfig(model_name_or_path=str(policy_dir), lora_r=4, lora_alpha=8,
                                           lora_dropout=0.0, lora_target_modules=["q_proj", "v_proj", "o_proj"]))
    from memgym.rewards.reward_types import SessionRewardConfig

    kw = {**dict(
        output_dir=str(out), use_cpu=True, bf16=False, report_to="none", activation_checkpointing=False,
        num_generations=4, per_device_train_batch_size=8, max_completion_length=10, max_steps=2, logging_steps=1,
        save_steps=1, learning_rate=0.05, beta=0.02, loss_type="dapo", seed=0, temperature=1.0,
        weighting="advantage", alpha=ALPHA), **kw}
    reward_keys = {f.name for f in dataclasses.fields(SessionRewardConfig)}
    args = ADRPOConfig(**{k: v for k, v in kw.items() if k not in reward_keys})
    reward = SessionReward(SessionRewardConfig(**{k: v for k, v in kw.items() if k in reward_keys}),
                           embedder=HashEmbedder(64), tokenizer=policy.tokenizer)
    return trainer_class(args)(policy.model, args=args, samples=samples, reward=reward,
                               processing_class=policy.tokenizer, peft_config=policy.peft_config)


@pytest.fixture(scope="module")
def trained(planted_dir, short_samples, tmp_path_factory):
    out = tmp_path_factory.mktemp("adrpo_run")
    trainer = _trainer(planted_dir, short_samples, out)
    before = trainable_state(trainer.model)
    trainer.train()
    return trainer, before, out


def test_two_adrpo_steps_change_parameters_and_log_finite_reward_parts(trained):
    trainer, before, _ = trained
    assert trainer.state.global_step == 2
    after = trainable_state(trainer.model)
    assert set(after) == set(before) and any("lora" in k for k in after)
    assert any(not torch.equal(before[k], after[k]) for k in before)
    steps = [h for h in trainer.state.log_history if "reward_parts/gate" in h]
    assert [h["step"] for h in steps] == [1, 2]
    for h in steps:
        for k in ("reward_parts/reward", "reward_parts/gate", "reward_parts/acc", "reward_parts/lp",
                  "reward_parts/weight", "adrpo/weight_mean", "frac_reward_zero_std",
                  "frac_reward_zero_std/counterfactual", "kl", "entropy"):
            assert math.isfinite(h[k]), k
        assert 0.0 <= h["reward_parts/gate"] <= 1.0 and 0.0 <= h["reward_parts/acc"] <= 1.0
        assert h["reward_parts/weight"] >= 1.0
        # the dominant-part histogram counts every one of the 8 completions once
        assert sum(h[f"dominant/{p}"] for p in ("episodic", "semantic", "procedural", "none")) == 8
        assert h["frac_reward_zero_std/counterfactual"] == h["frac_reward_zero_std"]
    # the planted policy writes valid and invalid outputs: some group had reward variance
    assert any(h["reward_std"] > 0 for h in steps)
    assert any(0.0 < h["reward_parts/gate"] < 1.0 for h in steps)


def trl_loss_types() -> list[str]:
    """Every ``loss_type`` the installed TRL offers (from ``GRPOConfig``'s own help text)."""
    import re

    from trl import GRPOConfig

    help_text = GRPOConfig.__dataclass_fields__["loss_type"].metadata["help"]
    return re.findall(r"'(\w+)'", re.search(r"Supported values are ([^.]*)\.", help_text).group(1))


def _grads_of(trainer, fn, batch):
    model = trainer.model
    model.zero_grad()
    loss = fn(model, batch)
    loss.backward()
    grads = {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return loss.item(), grads


@pytest.fixture()
def weighted_batch(trained):
    """One generation batch of the trained trainer scored twice from the same RNG seed: by
    stock ``GRPOTrainer._generate_and_score_completions`` and by ADRPO's, with the reward's
    weights forced to w = (4, 1, 1, 1, 4, 1, 1, 1) and its rewards to (1, 0, 0, 1) per group
    (so every advantage is ±0.866 ≠ 0). Yields (trainer, stock outputs, ADRPO outputs, w)."""
    from trl import GRPOTrainer

    trainer, _, _ = trained
    inner = trainer.reward_fn.reward
    w = [ALPHA, 1.0, 1.0, 1.0] * 2

    def forced(samples, completions, rollout_index=None, **kw):
        out = inner(samples, completions, rollout_index=rollout_index, **kw)
        return [dataclasses.replace(b, reward=float(i % 4 in (0, 3)), weight=w[i]) for i, b in enumerate(out)]

    trainer.reward_fn.reward = forced
    trainer.model.train()
    rows = [trainer.train_dataset[i] for i in range(2)]
    batch = [r for r in rows for _ in range(4)]
    try:
        torch.manual_seed(11)
        stock = GRPOTrainer._generate_and_score_completions(trainer, batch)
        torch.manual_seed(11)
        ours = trainer._generate_and_score_completions(batch)
        yield trainer, stock, ours, torch.tensor(w)
    finally:
        trainer.reward_fn.reward = inner
        trainer.loss_type = "dapo"
        trainer.beta = trainer.args.beta


def test_advantages_are_scaled_by_the_weights(weighted_batch):
    trainer, stock, ours, w = weighted_batch
    assert torch.equal(ours["completion_ids"], stock["completion_ids"])
    assert stock["advantages"].abs().tolist() == pytest.approx([math.sqrt(3) / 2] * 8, rel=1e-3)  # std + 1e-4
    torch.testing.assert_close(ours["advantages"], stock["advantages"] * w)
    assert "adrpo_weights" not in ours


def test_w1_step_equals_stock_grpo_for_every_trl_loss_type(weighted_batch):
    """With w = 1 (the non-dominant rows 1-3, 5-7) ADRPO's loss and gradients are stock TRL's,
    for every loss type TRL offers: ADRPO does not touch TRL's loss."""
    from trl import GRPOTrainer

    trainer, stock, ours, w = weighted_batch
    keep = [i for i in range(8) if w[i] == 1.0]
    sub = {k: (v[keep] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in ours.items()}
    ref = {k: (v[keep] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in stock.items()}
    types = trl_loss_types()
    assert {"grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo"} <= set(types)
    for lt in types:
        trainer.loss_type = lt
        loss, g = _grads_of(trainer, trainer.compute_loss, sub)
        loss_ref, g_ref = _grads_of(trainer, lambda m, b: GRPOTrainer._compute_loss(trainer, m, b), ref)
        assert loss == pytest.approx(loss_ref, rel=1e-6, abs=1e-9), lt
        assert g.keys() == g_ref.keys() and g, lt
        for k in g:
            torch.testing.assert_close(g[k], g_ref[k], rtol=1e-5, atol=1e-9, msg=lambda m: f"{lt}: {m}")


def test_w_alpha_gives_alpha_times_the_gradient_of_an_in_band_positive_token(weighted_batch):
    """Completion 0 is dominant (w = α) with Â > 0 and on-policy ratios (ρ = 1, in band): its
    gradient under ADRPO is α times stock GRPO's, for every loss type TRL offers (β = 0: the KL
    term is not weighted)."""
    from trl import GRPOTrainer

    trainer, stock, ours, w = weighted_batch
    assert w[0] == ALPHA and float(stock["advantages"][0]) > 0
    one = {k: (v[[0]] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in ours.items()}
    ref = {k: (v[[0]] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in stock.items()}
    trainer.beta = 0.0
    for lt in trl_loss_types():
        trainer.loss_type = lt
        loss, g = _grads_of(trainer, trainer.compute_loss, one)
        loss_ref, g_ref = _grads_of(trainer, lambda m, b: GRPOTrainer._compute_loss(trainer, m, b), ref)
        assert g and any(float(v.abs().sum()) > 0 for v in g_ref.values()), lt
        for k in g:
            torch.testing.assert_close(g[k], ALPHA * g_ref[k], rtol=1e-4, atol=1e-8, msg=lambda m: f"{lt}: {m}")


def test_eq12_trainer_loss_is_trl_loss_at_w1_and_ignores_w_for_positive_advantages(trained, tmp_path, short_samples,
                                                                                  planted_dir):
    """The Eq. 12 ablation's copied loss equals TRL's own at w = 1 (grpo, bnpo, dr_grpo, dapo;
    gradients too), and with Â > 0 on-policy it equals the unweighted loss for w = α: the
    defect the corrected weighting fixes."""
    from trl import GRPOTrainer

    from memgym.training.adrpo_config import EQ12_LOSS_TYPES
    from memgym.training.adrpo_eq12 import ADRPOEq12Trainer

    trainer, _, _ = trained
    eq12 = _trainer(planted_dir, short_samples, tmp_path / "eq12", weighting="unclipped", max_steps=1,
                    save_strategy="no")
    assert isinstance(eq12, ADRPOEq12Trainer)
    eq12.current_gradient_accumulation_steps = 1  # set by train(); both losses read it
    eq12.model.train()
    rows = [eq12.train_dataset[i] for i in range(2)]
    torch.manual_seed(5)
    inputs = eq12._generate_and_score_completions([r for r in rows for _ in range(4)])
    keep = [0, 1, 4, 5]
    inputs = {k: (v[keep] if isinstance(v, torch.Tensor) and v.dim() > 0 else v) for k, v in inputs.items()}
    adv = torch.tensor([1.0, -0.5, 0.3, -0.8])
    stock_loss = lambda m, b: GRPOTrainer._compute_loss(eq12, m, b)  # noqa: E731
    for lt in EQ12_LOSS_TYPES:
        eq12.loss_type = lt
        ours, g = _grads_of(eq12, eq12.compute_loss, {**inputs, "advantages": adv, "adrpo_weights": torch.ones(4)})
        ref, g_ref = _grads_of(eq12, stock_loss, {**inputs, "advantages": adv})
        assert ours == pytest.approx(ref, rel=1e-5, abs=1e-7), lt
        assert g.keys() == g_ref.keys() and g
        for k in g:
            torch.testing.assert_close(g[k], g_ref[k], rtol=1e-4, atol=1e-7)
    pos = {**inputs, "advantages": adv.abs()}
    w = torch.tensor([4.0, 1.0, 4.0, 1.0])
    unclipped, _ = _grads_of(eq12, eq12.compute_loss, {**pos, "adrpo_weights": w})
    stock, _ = _grads_of(eq12, stock_loss, pos)
    amplified, _ = _grads_of(eq12, stock_loss, {**pos, "advantages": adv.abs() * w})
    assert unclipped == pytest.approx(stock, rel=1e-5, abs=1e-7)
    assert amplified != pytest.approx(stock, rel=1e-3)
    # and it trains: one real step through TRL's batching with the weights beside the advantages
    eq12.train()
    assert eq12.state.global_step == 1
    assert any("reward_parts/weight" in h and math.isfinite(h["loss"]) for h in eq12.state.log_history if "loss" in h)

    from memgym.training.adrpo_trainer import ADRPOTrainer

    with pytest.raises(ValueError, match="needs its own loss"):
        ADRPOTrainer(eq12.model, args=eq12.args, samples=short_samples, reward=None)
    with pytest.raises(ValueError, match="weighting: unclipped ablation"):
        ADRPOEq12Trainer(eq12.model, args=trainer.args, samples=short_samples, reward=None)


def test_resume_continues_the_step_count(trained, planted_dir, short_samples, tmp_path):
    _, _, out = trained
    ckpt = out / "checkpoint-2"
    assert (ckpt / "trainer_state.json").is_file() and (ckpt / "adapter_model.safetensors").is_file()
    resumed = _trainer(planted_dir, short_samples, tmp_path / "resumed", max_steps=3)
    resumed.train(resume_from_checkpoint=str(ckpt))
    assert resumed.state.global_step == 3
    # the history of steps 1-2 comes back from the checkpoint; step 3 is new
    assert [h["step"] for h in resumed.state.log_history if "reward_parts/gate" in h] == [1, 2, 3]


def test_init_from_an_adapter_continues_it(trained, short_samples, tmp_path):
    """An SFT-style adapter dir (here the run's checkpoint) loads as the trainable policy, with
    TRL's frozen 'ref' copy of it as the KL reference."""
    from safetensors.torch import load_file

    _, _, out = trained
    ckpt = out / "checkpoint-2"
    trainer = _trainer(ckpt, short_samples, tmp_path / "from_adapter")
    saved = load_file(str(ckpt / "adapter_model.safetensors"))
    params = dict(trainer.model.named_parameters())
    assert "ref" in trainer.model.peft_config
    checked = 0
    for name, value in saved.items():
        live = name.replace(".weight", ".default.weight")
        assert live in params and params[live].requires_grad, name
        torch.testing.assert_close(params[live].detach(), value)
        checked += 1
    assert checked == 12  # 2 layers x 3 modules x (lora_A, lora_B)


# ---- recipes and commands --------------------------------------------------------------------
@pytest.mark.parametrize("name,expect", [
    ("adrpo_cpu", dict(use_vllm=False, loss_type="dapo", num_generations=4, temperature=0.8, top_p=0.9,
                       beta=0.02, judge="answer-recall", use_peft=True, generation_batch_size=4)),
    ("adrpo_qwen3_4b_colocate", dict(use_vllm=True, vllm_mode="colocate", loss_type="grpo", num_generations=8,
                                     temperature=0.8, top_p=0.9, learning_rate=1e-6, beta=0.02, judge="llm",
                                     model_name_or_path="Qwen/Qwen3-4B-Instruct-2507", init_from="runs/sft_qwen3_4b")),
    ("adrpo_qwen3_4b_server", dict(use_vllm=True, vllm_mode="server", vllm_server_port=8000, loss_type="grpo",
                                   num_generations=8, temperature=0.8, top_p=0.9, learning_rate=1e-6, beta=0.02,
                                   answer_model="openai:http://127.0.0.1:8001/v1#Qwen/Qwen3-4B-Instruct-2507")),
    ("demo_train_adrpo", dict(sessions=[1], max_prompt_tokens=1000, num_generations=4, generation_batch_size=4,
                              managers=["core"], max_completion_length=192, max_steps=2, segment_tokens=200,
                              screen_rows=1, row_keys=None)),
    ("train_cpu/adrpo", dict(managers=["core", "episodic", "semantic"], sessions=[1, 2, 3], max_prompt_tokens=1500,
                             segment_tokens=200, num_generations=8, generation_batch_size=8, max_completion_length=512,
                             save_steps=2, use_peft=True, top_p=1.0, max_steps=12, learning_rate=1e-3,
                             core_lp_lo=100, core_lp_hi=267, copy_penalty=1.0, copy_ngram=6)),
    ("adrpo_weighting/train_cpu_adrpo_weighting", dict(managers=["episodic", "semantic"], sessions=[1, 2, 3], segment_tokens=200,
                                       num_generations=4, generation_batch_size=4, max_steps=3, save_steps=1,
                                       row_keys=["conv-26/s1.2/episodic", "conv-26/s2.1/episodic",
                                                 "conv-26/s2.1/semantic", "conv-26/s2.2/semantic",
                                                 "conv-26/s3.2/episodic", "conv-26/s3.6/semantic"])),
])
def test_recipes_parse_and_pass_trl_fields_through(name, expect):
    from pathlib import Path

    from memgym.training.adrpo import parse_args

    repo = Path(__file__).resolve().parents[2]
    recipe = next(p for p in (repo / "launch" / "recipes" / f"{name}.yaml",
                              repo / "scripts" / "experiments" / f"{name}.yaml") if p.is_file())
    sections = parse_args(["--config", str(recipe)])
    for field_name, value in expect.items():
        (home,) = [s for s in sections if hasattr(s, field_name)]
        assert getattr(home, field_name) == value, field_name
    _, reward, cfg, _ = sections
    assert cfg.weighting == "advantage" and reward.alpha == 4.0 and reward.mode == "counterfactual"
