"""The CPU log-prob experiment: what TRL's fused LM head costs on CPU when it projects every
position (TRL 1.16's rule off Triton devices) against only the labelled positions
(:func:`memgym.training.common.score_labelled_positions_only`), side by side in one run.

One training micro-batch as the trainers see it: SmolLM2-135M (the embedded policy, float32),
``--batch`` rows of ``--prompt`` prompt tokens (label -100) and ``--completion`` completion
tokens, one forward + backward through ``model(..., fused_lm_head=True)`` (TRL's
``add_fused_lm_head``). ``--rounds`` alternating rounds so machine noise hits both alike;
prints the median process-CPU seconds of each rule, their ratio, and whether the loss and
the gradient norm agree (they must: the unlabelled positions are masked to zero either way).
"""
from __future__ import annotations

import argparse
import json
import statistics
import time


def step(model, ids, labels) -> tuple[float, float, float]:
    """(CPU seconds, loss, gradient norm) of one forward + backward."""
    import torch

    model.zero_grad(set_to_none=True)
    t0 = time.process_time()
    out = model(input_ids=ids, labels=labels, fused_lm_head=True)
    out.loss.backward()
    cpu = time.process_time() - t0
    norm = torch.sqrt(sum((p.grad.double() ** 2).sum() for p in model.parameters() if p.grad is not None))
    return cpu, float(out.loss), float(norm)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--prompt", type=int, default=1024, help="prompt tokens per row (no label)")
    ap.add_argument("--completion", type=int, default=128, help="completion tokens per row (labelled)")
    ap.add_argument("--rounds", type=int, default=3)
    a = ap.parse_args(argv)

    import torch
    import trl.trainer.utils as trl_utils
    from transformers import AutoModelForCausalLM
    from trl.trainer.utils import add_fused_lm_head

    from memgym.llm.specs import resolve_model_path
    from memgym.training.common import score_labelled_positions_only

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(resolve_model_path("smollm2"), dtype=torch.float32)
    add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    n = a.prompt + a.completion
    ids = torch.randint(0, model.config.vocab_size, (a.batch, n))
    labels = ids.clone()
    labels[:, : a.prompt] = -100
    score_labelled_positions_only()
    labelled = trl_utils._use_triton
    every = labelled.every_position_rule
    runs = {"every position": [], "labelled only": []}
    for _ in range(a.rounds):
        for name, rule in (("every position", every), ("labelled only", labelled)):
            trl_utils._use_triton = rule
            runs[name].append(step(model, ids, labels))
    trl_utils._use_triton = labelled
    rows = {k: {"cpu_s": statistics.median(r[0] for r in v), "loss": v[0][1], "grad_norm": v[0][2]}
            for k, v in runs.items()}
    e, lab = rows["every position"], rows["labelled only"]
    result = {"batch": a.batch, "prompt_tokens": a.prompt, "completion_tokens": a.completion, "rounds": a.rounds,
              "torch_threads": torch.get_num_threads(), **{k.replace(" ", "_"): v for k, v in rows.items()},
              "speedup": round(e["cpu_s"] / lab["cpu_s"], 2),
              "loss_equal": abs(e["loss"] - lab["loss"]) <= 1e-5 * max(1.0, abs(e["loss"])),
              "grad_norm_rel_diff": abs(e["grad_norm"] - lab["grad_norm"]) / max(e["grad_norm"], 1e-12)}
    for k, v in rows.items():
        print(f"{k:>15}: {v['cpu_s']:7.2f} CPU-s  loss {v['loss']:.6f}  grad norm {v['grad_norm']:.6f}")
    print(f"labelled only is {result['speedup']}x cheaper; loss equal: {result['loss_equal']}; "
          f"grad norm rel. diff {result['grad_norm_rel_diff']:.2e}")
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
