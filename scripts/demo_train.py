"""``make demo-train``: the whole training pipeline on CPU, end to end, in about 20 minutes.

1. SFT (TRL ``SFTTrainer`` + LoRA) of the embedded SmolLM2-135M-Instruct for a few steps on
   LoCoMo conv-26's expert trajectory (``launch/recipes/demo_train_sft.yaml``).
2. ADRPO for a few steps from the SFT adapter, dense session reward with the offline
   answer-recall judge (``launch/recipes/demo_train_adrpo.yaml``).
3. ``memgym eval`` on a conversation NOT trained on (LoCoMo conv-41, its first 2 sessions and
   the 10 QA whose evidence lies in them, ``launch/recipes/demo_train_eval.yaml``), with the
   base SmolLM2 and the trained adapter as extractors side by side (same answer model, same
   LoCoMo F1 scorer).

Writes ``<out>/`` (default ``runs/demo_train``): ``sft/`` and ``adrpo/`` (adapters, logs),
``eval/`` (the eval job's report files), ``reward_curve.png``, ``summary.json`` and
``report.md`` with both eval tables. Usage::

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


def run_sft(out: Path, steps: int | None) -> dict:
    """Stage 1: ``training.sft.run`` with the demo recipe; returns its metrics dict."""
    from training.sft import parse_args, run

    argv = ["--config", str(RECIPES / "demo_train_sft.yaml"), "--output_dir", str(out / "sft")]
    if steps is not None:
        argv += ["--max_steps", str(steps)]
    return run(*parse_args(argv))


def run_adrpo(out: Path, steps: int | None) -> list[dict]:
    """Stage 2: ADRPO from the SFT adapter; returns the trainer's log history (also written
    to ``adrpo/log_history.json``)."""
    from training.adrpo import build_trainer, parse_args, train

    argv = ["--config", str(RECIPES / "demo_train_adrpo.yaml"), "--init_from", str(out / "sft"),
            "--output_dir", str(out / "adrpo")]
    if steps is not None:
        argv += ["--max_steps", str(steps)]
    args, model_args = parse_args(argv)
    trainer = train(args, build_trainer(args, model_args))
    history = trainer.state.log_history
    (out / "adrpo" / "log_history.json").write_text(json.dumps(history, indent=2) + "\n")
    del trainer
    gc.collect()
    return history


def run_evaluation(out: Path) -> dict:
    """Stage 3: the eval job with the base model and the trained adapter side by side."""
    from rewards.scoring.evaluate import EvalConfig, run_eval
    from training.common import parse_training_args

    (cfg,) = parse_training_args([EvalConfig], ["--config", str(RECIPES / "demo_train_eval.yaml"), "--compare",
                                                f"hf:{out / 'adrpo'}", "--out", str(out / "eval")],
                                 "demo-train eval", "eval stage", cpu_defaults=False)
    return run_eval(cfg)


def step_rows(history: list[dict]) -> list[dict]:
    """One row per logged ADRPO step: step, the reward parts, frac_reward_zero_std, kl, loss."""
    rows = []
    for h in history:
        if "reward_parts/reward" not in h:
            continue
        row = {"step": h["step"], **{p: h.get(f"reward_parts/{p}") for p in PARTS}}
        row.update(reward_std=h.get("reward_std"), frac_zero_std=h.get("frac_reward_zero_std"), kl=h.get("kl"),
                   loss=h.get("loss"), dominant={p: h.get(f"dominant/{p}") for p in
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


def write_report(out: Path, sft: dict, rows: list[dict], report: dict, timings: dict, threads: int | None) -> None:
    """``report.md``: SFT losses, the ADRPO step table and curve, both eval tables."""
    from rewards.scoring.report import side_by_side

    base, trained = report["extractor"], next(iter(report["compare"]))
    lines = ["# memgym demo-train: SFT → ADRPO → eval on a held-out conversation", "",
             f"Wall time: SFT {timings['sft_s']:.0f} s, ADRPO {timings['adrpo_s']:.0f} s, eval "
             f"{timings['eval_s']:.0f} s (total {sum(timings.values()):.0f} s on {os.cpu_count()} cores, torch threads "
             f"{threads or 'default'}, 1-min load average at the end {os.getloadavg()[0]:.1f}).", "",
             "## 1. SFT (LoRA, conv-26 expert trajectory)", "",
             f"{sft['global_step']} steps on {sft['examples']['train']} examples. Loss on the train probe "
             f"{_f(sft.get('train_loss_start'))} → {_f(sft.get('train_loss_end'))}; on conv-30 (validation) "
             f"{_f(sft.get('eval_loss_start'))} → {_f(sft.get('eval_loss_end'))}.", "",
             "## 2. ADRPO from the SFT adapter (answer-recall reward, counterfactual banks, corrected weighting)", "",
             "![reward curve](reward_curve.png)", "",
             "| step | reward | gate | acc | LP | weight | reward std | frac zero-std groups | kl | dominant E/S/P/none |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["dominant"]
        lines.append(f"| {r['step']} | {_f(r['reward'])} | {_f(r['gate'])} | {_f(r['acc'])} | {_f(r['lp'])} | "
                     f"{_f(r['weight'], 2)} | {_f(r['reward_std'])} | {_f(r['frac_zero_std'], 2)} | "
                     f"{_f(r['kl'], 4)} | {'/'.join(str(int(d[p] or 0)) for p in d)} |")
    cfg = report["config"]
    lines += ["", f"## 3. Eval on {', '.join(cfg['conversations'])} (not trained on), first {cfg['n_sessions']} "
                  f"sessions, {report['n']} QA", "",
              f"Extractors: base `{base}` vs trained `{trained}`; answer model `{report['answer_model']}`, "
              f"scorer `{report['scorer']}` (LoCoMo F1).", "",
              "### Base vs trained, by category", "", side_by_side(report, "by_category"), "",
              "### By capability", "", side_by_side(report, "by_capability"), "",
              "### Answer recall of the retrieved memory and format failures", "",
              "| extractor | answer recall | format-failure rate per manager |", "|---|---|---|"]
    for spec, r in [(base, report)] + list(report["compare"].items()):
        ffr = ", ".join(f"{m} {v:.2f}" for m, v in r["format_failure_rate"].items())
        lines.append(f"| {spec} | {r['overall_recall']:.3f} | {ffr} |")
    lines += ["", "Full eval report: [eval/report.md](eval/report.md). A few CPU steps on one conversation "
                  "are a smoke test of the pipeline, not a training result."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo_train", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="runs/demo_train", help="output dir (default runs/demo_train)")
    p.add_argument("--sft-steps", type=int, default=None, help="override the SFT recipe's max_steps")
    p.add_argument("--adrpo-steps", type=int, default=None, help="override the ADRPO recipe's max_steps")
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
    t = time.time()
    print("== 1/3 SFT", flush=True)
    sft = run_sft(out, a.sft_steps)
    timings["sft_s"] = time.time() - t
    gc.collect()
    t = time.time()
    print("== 2/3 ADRPO", flush=True)
    rows = step_rows(run_adrpo(out, a.adrpo_steps))
    timings["adrpo_s"] = time.time() - t
    plot_reward_curve(rows, out / "reward_curve.png")
    t = time.time()
    print("== 3/3 eval (base vs trained)", flush=True)
    report = run_evaluation(out)
    timings["eval_s"] = time.time() - t
    write_report(out, sft, rows, report, timings, threads)
    summary = {"timings_s": {k: round(v, 1) for k, v in timings.items()}, "torch_threads": threads,
               "sft": {k: sft.get(k) for k in ("global_step", "train_loss_start", "train_loss_end",
                                               "eval_loss_start", "eval_loss_end")},
               "adrpo_steps": rows,
               "eval": {spec: {"overall_f1": r["overall"], "answer_recall": r["overall_recall"], "n": r["n"]}
                        for spec, r in [(report["extractor"], report)] + list(report["compare"].items())}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print((out / "report.md").read_text())
    print(f"demo-train: wrote {out}/report.md, reward_curve.png, summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
