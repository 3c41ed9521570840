"""``make demo-train``: the whole training pipeline on CPU, end to end, within 15 minutes.

1. SFT (TRL ``SFTTrainer``, full fine-tuning) of the embedded SmolLM2-135M-Instruct for 16
   steps on 200-token segments of LoCoMo conv-26's expert trajectory
   (``launch/recipes/demo_train_sft.yaml``, the cut of ``scripts/experiments/train_cpu/sft.yaml``).
2. ADRPO (LoRA over the SFT model) for two steps on a core segment row whose sampled rollouts
   get different rewards (``screen_rows``), dense session reward with the offline answer-recall
   judge (``launch/recipes/demo_train_adrpo.yaml``).

Both trainers measure themselves at every evaluation (:mod:`memgym.training.callbacks`): the greedy
validation session reward on conv-30's first segment rows with per-manager format failures,
and the answer-recall of the bank the model builds over the first turns of held-out LoCoMo
conv-41. The report's tables and curve are read from the two ``trainer_state.json`` files'
``log_history``: base = the SFT run's first evaluation (step 0), SFT = its last, SFT+ADRPO =
the ADRPO run's last.

Writes ``<out>/`` (default ``runs/demo_train``): ``sft/`` and ``adrpo/`` (models,
``trainer_state.json``), ``reward_curve.png``, ``summary.json`` and ``report.md``. Usage::

    python scripts/demo_train.py [--out runs/demo_train] [--sft-steps N] [--adrpo-steps N]
"""
from __future__ import annotations

import argparse
import gc
import json
import math
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "launch" / "recipes"
PARTS = ("reward", "gate", "acc", "lp", "weight")


def choose_threads(requested: int | None) -> int | None:
    """``requested`` if given (must be >= 1); else 1 when the 1-minute load average exceeds the
    number of cores (a busy machine: every extra torch thread waits for a time slice at each
    op), else None (keep torch's default). Raises ValueError for ``requested < 1``."""
    if requested is not None:
        if requested < 1:
            raise ValueError(f"--threads must be >= 1, got {requested}")
        return requested
    return 1 if os.getloadavg()[0] > (os.cpu_count() or 1) else None


def run_sft(out: Path, steps: int | None) -> tuple[dict, int | None]:
    """Stage 1: ``memgym.training.sft.run`` with the demo recipe; returns its metrics dict and the
    recipe's ``segment_tokens`` (None = whole sessions): the cut the SFT model learns, which
    the held-out measurement then builds banks on."""
    from memgym.training.sft import parse_args, run

    argv = ["--config", str(RECIPES / "demo_train_sft.yaml"), "--output_dir", str(out / "sft")]
    if steps is not None:
        argv += ["--max_steps", str(steps)]
    script_args, training_args, model_args = parse_args(argv)
    return run(script_args, training_args, model_args), script_args.segment_tokens


def run_adrpo(out: Path, steps: int | None) -> list[dict]:
    """Stage 2: ADRPO from the SFT model; returns the trainer's log history (also in
    ``adrpo/trainer_state.json``)."""
    from memgym.training.adrpo import build_trainer, parse_args, train

    argv = ["--config", str(RECIPES / "demo_train_adrpo.yaml"), "--init_from", str(out / "sft"),
            "--output_dir", str(out / "adrpo")]
    if steps is not None:
        argv += ["--max_steps", str(steps)]
    configs = parse_args(argv)
    trainer = train(configs[2], build_trainer(*configs))
    history = trainer.state.log_history  # also in adrpo/trainer_state.json
    del trainer
    gc.collect()
    return history


def measurements(history: list[dict]) -> list[dict]:
    """The in-trainer measurements of a ``log_history`` (:mod:`memgym.training.callbacks`), in step order."""
    from memgym.training.callbacks import PREFIX

    return [h for h in history if f"{PREFIX}/validation_reward" in h]


def step_rows(history: list[dict]) -> list[dict]:
    """One row per logged ADRPO step: step, the reward parts, frac_reward_zero_std, kl, loss."""
    rows = []
    for h in history:
        if "reward_parts/reward" not in h:
            continue
        row = {"step": h["step"], **{p: h.get(f"reward_parts/{p}") for p in PARTS}}
        row.update(reward_std=h.get("reward_std"), frac_zero_std=h.get("frac_reward_zero_std"), kl=h.get("kl"),
                   loss=h.get("loss"), grad_norm=h.get("grad_norm"), dominant={p: h.get(f"dominant/{p}") for p in
                                                 ("episodic", "semantic", "procedural", "none")})
        rows.append(row)
    return rows


def plot_reward_curve(rows: list[dict], path: Path) -> None:
    """Reward and its parts (gate, acc, LP) per ADRPO step, one PNG."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.6))
    steps = [r["step"] for r in rows]
    for part, style in (("reward", "o-"), ("gate", "s--"), ("acc", "^--"), ("lp", "x:")):
        ax.plot(steps, [r[part] for r in rows], style, label=part)
    ax.set_xlabel("ADRPO step")
    ax.set_ylabel("mean over the step's completions")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xticks(steps)
    ax.set_title("ADRPO reward parts per step (SmolLM2 + LoRA, conv-26)", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _f(x, nd=3):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def measure_table(rows: dict[str, dict]) -> list[str]:
    """Markdown lines: one row per model state (a ``log_history`` measurement) with the
    validation reward, the per-manager format-failure rates of the validation outputs, and the
    held-out bank's entries and answer recall."""
    from memgym.memory_bank.actions import MANAGERS
    from memgym.training.callbacks import PREFIX

    lines = ["| model | step | validation reward | " + " | ".join(f"{m} format failures" for m in MANAGERS)
             + " | held-out bank entries | held-out answer recall | held-out QA |", "|---" * (len(MANAGERS) + 6) + "|"]
    for name, h in rows.items():
        lines.append(f"| {name} | {h['step']} | {_f(h.get(f'{PREFIX}/validation_reward'))} | "
                     + " | ".join(_f(h.get(f"{PREFIX}/format_failure/{m}"), 2) for m in MANAGERS)
                     + f" | {int(h.get(f'{PREFIX}/heldout_entries', 0))} | {_f(h.get(f'{PREFIX}/heldout_answer_recall'))}"
                     f" | {int(h.get(f'{PREFIX}/heldout_qa', 0))} |")
    return lines


def write_report(out: Path, sft: dict, rows: list[dict], measured: dict[str, dict], timings: dict,
                 threads: int | None, segment_tokens: int | None = None) -> None:
    """``report.md``: SFT losses, the ADRPO step table and curve, the measurement table."""
    lines = ["# memgym demo-train: SFT → ADRPO, measured inside the trainers", "",
             f"Wall time: SFT {timings['sft_s']:.0f} s, ADRPO {timings['adrpo_s']:.0f} s (total "
             f"{sum(timings.values()):.0f} s on {os.cpu_count()} cores, torch threads {threads or 'default'}, 1-min load "
             f"average at the end {os.getloadavg()[0]:.1f}); each includes its evaluations.", "",
             f"## 1. SFT (full fine-tuning, conv-26 expert trajectory, "
             f"{f'{segment_tokens}-token segments' if segment_tokens else 'whole sessions'})", "",
             f"{sft['global_step']} steps on {sft['examples']['train']} examples. Loss on the train probe "
             f"{_f(sft.get('train_loss_start'))} → {_f(sft.get('train_loss_end'))}; on conv-30 (validation) "
             f"{_f(sft.get('eval_loss_start'))} → {_f(sft.get('eval_loss_end'))}.", "",
             "## 2. ADRPO from the SFT model (LoRA; answer-recall reward, counterfactual banks, corrected weighting)",
             "", "Rows: `adrpo/screen.json` (the rewards of each tried row's sampled rollouts).", "",
             "![reward curve](reward_curve.png)", "",
             "| step | reward | gate | acc | LP | weight | reward std | frac zero-std groups | kl | loss | grad norm "
             "| dominant E/S/P/none |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["dominant"]
        lines.append(f"| {r['step']} | {_f(r['reward'])} | {_f(r['gate'])} | {_f(r['acc'])} | {_f(r['lp'])} | "
                     f"{_f(r['weight'], 2)} | {_f(r['reward_std'])} | {_f(r['frac_zero_std'], 2)} | "
                     f"{_f(r['kl'], 4)} | {_f(r['loss'], 4)} | {_f(r['grad_norm'], 4)} | "
                     f"{'/'.join(str(int(d[p] or 0)) for p in d)} |")
    lines += ["", "## 3. Measured at each evaluation (training/callbacks.py, from trainer_state.json)", "",
              "Greedy decoding, 192 tokens per output. Validation: conv-30's first session-1 segment rows (one per "
              "manager), session reward with the answer-recall judge over the counterfactual bank; a format failure is "
              "an output the bank rejects (not JSON, wrong schema, unknown id, cut off at the token limit). Held-out: "
              "the bank the model builds over the first turns of conv-41 (never trained on), "
              f"{f'{segment_tokens}-token segments' if segment_tokens else 'whole sessions'}, top-10 retrieval "
              "(all-MiniLM-L6-v2), answer recall of the retrieved memory.", ""] + measure_table(measured)
    lines += ["", "A few CPU steps on one conversation: the format is what they can teach; the full recipe "
                  "(`scripts/experiments/train_cpu/`) measures more."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo_train", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="runs/demo_train", help="output dir (default runs/demo_train)")
    p.add_argument("--sft-steps", type=int, default=None, help="override the SFT recipe's max_steps")
    p.add_argument("--adrpo-steps", type=int, default=None, help="override the ADRPO recipe's max_steps")
    p.add_argument("--report-only", action="store_true",
                   help="write the report of the runs already in --out (sft/ and adrpo/ trainer_state.json, "
                        "sft/metrics.json), e.g. make train-cpu's; trains nothing")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 when the 1-minute load average exceeds the core count, "
                        "else torch's default; on a shared CPU, 1 thread ran generation 8x faster than 2 here)")
    a = p.parse_args(argv)
    threads = choose_threads(a.threads)
    if threads is not None:
        import torch

        torch.set_num_threads(threads)
    print(f"demo-train: torch threads {threads or 'default'}, load average {os.getloadavg()[0]:.1f}, "
          f"{os.cpu_count()} cores", flush=True)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    timings = {}
    if a.report_only:
        sft = json.loads((out / "sft" / "metrics.json").read_text())
        segment_tokens = sft.get("segment_tokens")
        history = json.loads((out / "adrpo" / "trainer_state.json").read_text())["log_history"]
        timings = {"sft_s": sft.get("wall_s", 0.0), "adrpo_s": 0.0}
    else:
        t = time.time()
        print("== 1/2 SFT", flush=True)
        sft, segment_tokens = run_sft(out, a.sft_steps)
        timings["sft_s"] = time.time() - t
        gc.collect()
        t = time.time()
        print("== 2/2 ADRPO", flush=True)
        history = run_adrpo(out, a.adrpo_steps)
        timings["adrpo_s"] = time.time() - t
    rows = step_rows(history)
    plot_reward_curve(rows, out / "reward_curve.png")
    sft_m = measurements(json.loads((out / "sft" / "trainer_state.json").read_text())["log_history"])
    adrpo_m = measurements(history)
    measured = {"base (hf:smollm2)": sft_m[0], "SFT": sft_m[-1], "SFT+ADRPO": adrpo_m[-1]}
    write_report(out, sft, rows, measured, timings, threads, segment_tokens)
    summary = {"timings_s": {k: round(v, 1) for k, v in timings.items()}, "torch_threads": threads,
               "sft": {k: sft.get(k) for k in ("global_step", "train_loss_start", "train_loss_end",
                                               "eval_loss_start", "eval_loss_end")},
               "adrpo_steps": rows, "measured": measured}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print((out / "report.md").read_text())
    print(f"demo-train: wrote {out}/report.md, reward_curve.png, summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
