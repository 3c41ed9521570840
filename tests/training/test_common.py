"""The trainers' CPU switch for TRL's fused LM head: scoring only the labelled positions keeps
the loss, the per-token log-probabilities and every gradient; and the block in which transformers
loads models whole under DeepSpeed ZeRO-3 (``outside_zero3``; end to end in tests/launch/test_zero3.py)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch


def test_labelled_positions_only_keeps_loss_log_probs_and_gradients(tiny_model_dir):
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from memgym.training.common import score_labelled_positions_only

    score_labelled_positions_only()
    score_labelled_positions_only()  # idempotent: one wrapper, TRL's rule kept beside it
    labelled = trl_utils._use_triton
    every = labelled.every_position_rule
    assert not hasattr(every, "every_position_rule")
    cpu = torch.device("cpu")
    assert labelled(cpu) and not every(cpu)  # TRL 1.16 scores every position on CPU

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir, dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (2, 24), generator=g)
    labels = ids.clone()
    labels[:, :16] = -100  # the prompt
    labels[1, 21:] = -100  # padding after a shorter completion

    def step(rule):
        trl_utils._use_triton = rule
        model.zero_grad(set_to_none=True)
        out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        out.loss.backward()
        return out.loss.detach(), out.log_probs.detach(), [p.grad.clone() for p in model.parameters()]

    try:
        loss_e, lp_e, grads_e = step(every)
        loss_l, lp_l, grads_l = step(labelled)
    finally:
        trl_utils._use_triton = labelled
    assert lp_l.shape == (2, 23) and int((lp_l != 0).sum()) == 8 + 5  # labelled positions only are nonzero
    torch.testing.assert_close(loss_l, loss_e, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lp_l, lp_e, rtol=1e-5, atol=1e-6)
    assert len(grads_l) == len(grads_e) and all(torch.allclose(a, b, rtol=1e-5, atol=1e-7)
                                                for a, b in zip(grads_l, grads_e))
    assert any(float(g.abs().sum()) > 0 for g in grads_l)


def test_outside_zero3_turns_transformers_zero3_off_for_the_block_only():
    """Under ``accelerate launch``, ``TrainingArguments.__post_init__`` registers the plugin's config
    (``set_deepspeed_weakref``) and transformers then loads every model partitioned (zero.Init):
    neither ``zero3_init_flag: false`` nor accelerate's ``zero3_init_context_manager(enable=False)``
    turns that off; ``outside_zero3`` does, for its block."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed")
    from accelerate.utils import DeepSpeedPlugin
    from transformers.integrations import deepspeed_config, is_deepspeed_zero3_enabled, unset_hf_deepspeed_config

    from memgym.training.common import outside_zero3

    try:
        for flag in (False, True):
            plugin = DeepSpeedPlugin(zero_stage=3, zero3_init_flag=flag)
            plugin.set_deepspeed_weakref()
            assert is_deepspeed_zero3_enabled()
            with plugin.zero3_init_context_manager(enable=False):
                assert is_deepspeed_zero3_enabled()
            with outside_zero3(SimpleNamespace(deepspeed_plugin=plugin)):
                assert not is_deepspeed_zero3_enabled()
            assert is_deepspeed_zero3_enabled()
        stage2 = DeepSpeedPlugin(zero_stage=2)
        stage2.set_deepspeed_weakref()
        with outside_zero3(SimpleNamespace(deepspeed_plugin=stage2)), outside_zero3(SimpleNamespace()):
            assert deepspeed_config() is stage2.dschf.config  # ZeRO-2, no DeepSpeed: left as registered
    finally:
        unset_hf_deepspeed_config()
