"""The trainers' CPU switch for TRL's fused LM head: scoring only the labelled positions keeps
the loss, the per-token log-probabilities and every gradient."""
from __future__ import annotations

import torch


def test_labelled_positions_only_keeps_loss_log_probs_and_gradients(tiny_model_dir):
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from training.common import score_labelled_positions_only

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
