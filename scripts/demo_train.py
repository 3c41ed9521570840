"""``make demo-train``: the whole training pipeline on CPU, end to end, within 15 minutes.

1. SFT (TRL ``SFTTrainer``, full fine-tuning) of the embedded SmolLM2-135M-Instruct for 16
   steps on 200-token segments of LoCoMo conv-26's expert trajectory
   (``launch/recipes/demo_train_sft.yaml``, the cut of ``train_cpu_sft.yaml``).
2. ADRPO (LoRA over the SFT model) for one step on a segment row, dense session reward with the
   offline answer-recall judge (``launch/recipes/demo_train_adrpo.yaml``).
3. Held-out measurement (:func:`training.heldout.heldout_row`) on a conversation NOT trained on
   (LoCoMo conv-41, its first session and the QA whose evidence lies in it), with the base
   SmolLM2 and the trained model as extractors side by side, both building the session on the
   SFT recipe's segments (its ``segment_tokens``, from :func:`run_sft`): per-manager format-failure rate, bank
   size, answer-recall of the retrieved memory, LoCoMo F1 (same answer model).

Writes ``<out>/`` (default ``runs/demo_train``): ``sft/`` and ``adrpo/`` (models, logs),
``heldout.json``, ``reward_curve.png``, ``summary.json`` and ``report.md``. Usage::

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
    """Stage 1: ``training.sft.run`` with the demo recipe; returns its metrics dict and the
    recipe's ``segment_tokens`` (None = whole sessions): the cut the SFT model learns, which
    the held-out measurement then builds banks on."""
    from training.sft import parse_args, run

    argv = ["--config", str(RECIPES / "demo_train_sft.yaml"), "--output_dir", str(out / "sft")]
    if steps is not None:
        argv += ["--max_steps", str(steps)]
    script_args, training_args, model_args = parse_args(argv)
    return run(script_args, training_args, model_args), script_args.segment_tokens


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


def run_heldout(out: Path, trained: str, conversations=("conv-41",), n_sessions: int = 1,
                max_new_tokens: int = 512, segment_tokens: int | None = None) -> dict:
    """Stage 3: :func:`training.heldout.heldout_row` for the base SmolLM2 and ``trained`` on the
    held-out conversations, both building every session in segments of ``segment_tokens``
    transcript tokens (the SFT recipe's cut; None = whole sessions); returns ``{"base": row,
    "trained": row}`` (also ``heldout.json``)."""
    from data_synth.datasets import load_conversations
    from llm.runtime import Runtime
    from training.heldout import heldout_row

    rt = Runtime.from_config()
    convs = load_conversations("locomo", None, ids=list(conversations), n_sessions=n_sessions)
    rows = {name: heldout_row(spec, convs, rt, max_new_tokens=max_new_tokens, progress=True,
                              segment_tokens=segment_tokens)
            for name, spec in (("base", "hf:smollm2"), ("trained", trained))}
    (out / "heldout.json").write_text(json.dumps(rows, indent=2) + "\n")
    return rows


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


def heldout_table(rows: dict) -> list[str]:
    """Markdown lines: one row per extractor with the per-manager format-failure rates, bank
    entries, answer recall and LoCoMo F1."""
    ms = ("core", "episodic", "semantic", "procedural")
    lines = ["| extractor | " + " | ".join(f"{m} format failures" for m in ms) + " | bank entries (E+S+P) | "
             "answer recall | LoCoMo F1 | QA |", "|---" * (len(ms) + 5) + "|"]
    for name, r in rows.items():
        ffr = r["format_failure_rate"]
        lines.append(f"| {name} (`{r['extractor']}`) | " + " | ".join(_f(ffr[m], 2) for m in ms) +
                     f" | {r['bank_entries']} | {_f(r['answer_recall'])} | {_f(r['f1'])} | {r['n_qa']} |")
    return lines


def write_report(out: Path, sft: dict, rows: list[dict], heldout: dict, timings: dict, threads: int | None,
                 conversations, n_sessions: int, segment_tokens: int | None = None) -> None:
    """``report.md``: SFT losses, the ADRPO step table and curve, the held-out table."""
    cut = (f"sessions built in segments of <= {segment_tokens} transcript tokens, the cut the SFT trained on"
           if segment_tokens else "whole sessions")
    lines = ["# memgym demo-train: SFT → ADRPO → held-out conversation", "",
             f"Wall time: SFT {timings['sft_s']:.0f} s, ADRPO {timings['adrpo_s']:.0f} s, held-out measurement "
             f"{timings['heldout_s']:.0f} s (total {sum(timings.values()):.0f} s on {os.cpu_count()} cores, torch "
             f"threads {threads or 'default'}, 1-min load average at the end {os.getloadavg()[0]:.1f}).", "",
             f"## 1. SFT (full fine-tuning, conv-26 expert trajectory, "
             f"{f'{segment_tokens}-token segments' if segment_tokens else 'whole sessions'})", "",
             f"{sft['global_step']} steps on {sft['examples']['train']} examples. Loss on the train probe "
             f"{_f(sft.get('train_loss_start'))} → {_f(sft.get('train_loss_end'))}; on conv-30 (validation) "
             f"{_f(sft.get('eval_loss_start'))} → {_f(sft.get('eval_loss_end'))}.", "",
             "## 2. ADRPO from the SFT model (LoRA; answer-recall reward, counterfactual banks, corrected weighting)",
             "", "![reward curve](reward_curve.png)", "",
             "| step | reward | gate | acc | LP | weight | reward std | frac zero-std groups | kl | dominant E/S/P/none |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        d = r["dominant"]
        lines.append(f"| {r['step']} | {_f(r['reward'])} | {_f(r['gate'])} | {_f(r['acc'])} | {_f(r['lp'])} | "
                     f"{_f(r['weight'], 2)} | {_f(r['reward_std'])} | {_f(r['frac_zero_std'], 2)} | "
                     f"{_f(r['kl'], 4)} | {'/'.join(str(int(d[p] or 0)) for p in d)} |")
    lines += ["", f"## 3. Held-out: {', '.join(conversations)} (never trained on), first {n_sessions} session(s), "
                  f"free greedy decoding, {cut}", "",
              "Same answer model (`hf:smollm2`), retriever (all-MiniLM-L6-v2, top 10) and scorer (LoCoMo's official "
              "token F1) for both rows. A format failure is a manager output the bank rejects (not JSON, wrong "
              "schema, unknown id, cut off at the token limit).", ""] + heldout_table(heldout)
    lines += ["", "A few CPU steps on one conversation: the format is what they can teach; the full recipe "
                  "(`launch/recipes/train_cpu_*.yaml`, `scripts/train_cpu.py`) measures more."]
    (out / "report.md").write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="demo_train", description=(__doc__ or "").split("\n\n")[0])
    p.add_argument("--out", default="runs/demo_train", help="output dir (default runs/demo_train)")
    p.add_argument("--sft-steps", type=int, default=None, help="override the SFT recipe's max_steps")
    p.add_argument("--adrpo-steps", type=int, default=None, help="override the ADRPO recipe's max_steps")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: 1 when the 1-minute load average exceeds the core count, "
                        "else torch's default; on a shared CPU, 1 thread ran generation 8x faster than 2 here)")
    p.add_argument("--conversations", nargs="+", default=["conv-41"], help="held-out LoCoMo conversations")
    p.add_argument("--sessions", type=int, default=1, help="their first N sessions (default 1)")
    p.add_argument("--max-new-tokens", type=int, default=512, help="tokens per manager output (default 512)")
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
    sft, segment_tokens = run_sft(out, a.sft_steps)
    timings["sft_s"] = time.time() - t
    gc.collect()
    t = time.time()
    print("== 2/3 ADRPO", flush=True)
    rows = step_rows(run_adrpo(out, a.adrpo_steps))
    timings["adrpo_s"] = time.time() - t
    plot_reward_curve(rows, out / "reward_curve.png")
    t = time.time()
    print("== 3/3 held-out measurement (base vs trained)", flush=True)
    heldout = run_heldout(out, f"hf:{out / 'adrpo'}", a.conversations, a.sessions, a.max_new_tokens, segment_tokens)
    timings["heldout_s"] = time.time() - t
    write_report(out, sft, rows, heldout, timings, threads, a.conversations, a.sessions, segment_tokens)
    summary = {"timings_s": {k: round(v, 1) for k, v in timings.items()}, "torch_threads": threads,
               "sft": {k: sft.get(k) for k in ("global_step", "train_loss_start", "train_loss_end",
                                               "eval_loss_start", "eval_loss_end")},
               "adrpo_steps": rows,
               "heldout": {name: {k: r[k] for k in ("extractor", "format_failure_rate", "bank_entries", "answer_recall",
                                                    "f1", "n_qa")} for name, r in heldout.items()}}
    (out / "summary.json").write_text(json.dumps(summary, indent=2) + "\n")
    print((out / "report.md").read_text())
    print(f"demo-train: wrote {out}/report.md, reward_curve.png, summary.json")
    return 0


if __name__ == "__main__":
    sys.exit(main())
