"""The measurements and report of the CPU training recipe (``launch/recipes/train_cpu_*.yaml``).

Two subcommands, each restartable (a finished measurement is a JSON file that is never redone;
model responses are also in the sqlite response cache):

``measure LABEL SPEC``: for one extractor (``hf:smollm2``, ``hf:runs/train_cpu/sft``, a
checkpoint dir, an adapter dir), writes ``<out>/measure/<LABEL>.json`` with

- ``validation`` (unless ``--heldout-only``): :func:`training.heldout.validation_reward` on conv-30's expert sessions
  (the validation trajectory; rows of sessions ``--val-sessions`` whose prompt fits
  ``--val-max-prompt-tokens``): mean session reward (counterfactual bank, answer-recall judge,
  λ = 0.8) and the per-manager format-failure rate of the greedy outputs;
- ``heldout`` (unless ``--validation-only``): :func:`training.heldout.heldout_row` on LoCoMo
  conv-41 and conv-42 (never trained on), their first ``--sessions`` sessions and the QA whose
  evidence lies there: per-manager format-failure rate, bank size, answer-recall of the
  retrieved memory, LoCoMo F1 of the answers of ``--answer-model`` (the same for every row).

``report``: ``<out>/report.md`` with the held-out table, the validation table, the SFT loss /
format-failure by step and the ADRPO reward by step (``curves.png``), wall times and peak RSS
(from ``/usr/bin/time -v`` logs ``<out>/*.log`` when present).

Usage::

    python scripts/train_cpu.py measure base hf:smollm2 --out runs/train_cpu
    python scripts/train_cpu.py measure sft-step-12 hf:runs/train_cpu/sft/checkpoint-12 --validation-only
    python scripts/train_cpu.py report --out runs/train_cpu [--steps base=0 sft-step-12=12 ...]
"""
from __future__ import annotations

import argparse
import functools
import json
import math
import os
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

MANAGERS = ("core", "episodic", "semantic", "procedural")


def _write_atomic(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def measure(a) -> int:
    from data_synth.datasets import load_conversations
    from llm.embeddings import load_embedder
    from llm.runtime import Runtime
    from rewards.session_reward import SessionReward, SessionRewardConfig
    from training.common import load_tokenizer, resolve_model_path
    from training.heldout import heldout_row, validation_reward, validation_samples

    path = Path(a.out) / "measure" / f"{a.label}.json"
    done = json.loads(path.read_text()) if path.is_file() else {}
    rt = Runtime.from_config(cache=a.cache, batch_size=a.batch_size)
    if "validation" not in done and not a.heldout_only:
        tok = load_tokenizer(resolve_model_path("smollm2"))
        emb = load_embedder("minilm")
        samples = validation_samples(a.val_trajectories, sessions=a.val_sessions,
                                     max_prompt_tokens=a.val_max_prompt_tokens, tokenizer=tok, embedder=emb,
                                     segment_tokens=a.segment_tokens)
        reward = SessionReward(SessionRewardConfig(mode="counterfactual", judge="answer-recall", lam=0.8, alpha=4.0,
                                                   top_k=10), embedder=emb, tokenizer=tok)
        t = time.time()
        done["validation"] = validation_reward(a.spec, samples, reward, rt, max_new_tokens=a.max_new_tokens)
        done["validation"]["wall_s"] = round(time.time() - t, 1)
        done["validation"]["rows"] = [s.key for s in samples]
        done["validation"]["segment_tokens"] = a.segment_tokens
        _write_atomic(path, done)
        print(f"{a.label}: validation reward {done['validation']['reward']:.3f}, format failures "
              f"{done['validation']['format_failure_rate']}", flush=True)
    if not a.validation_only and "heldout" not in done:
        convs = load_conversations("locomo", None, ids=a.conversations, n_sessions=a.sessions)
        done["heldout"] = heldout_row(a.spec, convs, rt, answer_model=a.answer_model, max_new_tokens=a.max_new_tokens,
                                      progress=True, segment_tokens=a.segment_tokens)
        done["heldout"]["sessions"] = a.sessions
        _write_atomic(path, done)
        h = done["heldout"]
        print(f"{a.label}: held-out format failures {h['format_failure_rate']}, bank {h['bank_entries']} entries, "
              f"answer recall {h['answer_recall']:.3f}, F1 {h['f1']:.3f} ({h['n_qa']} QA)", flush=True)
    done.update(label=a.label, spec=a.spec)
    _write_atomic(path, done)
    return 0


# ---------------------------------------------------------------- report

def _f(x, nd=3):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def _history(run_dir: Path) -> list[dict]:
    """The trainer log history of a run dir: metrics.json / log_history.json, else the latest
    checkpoint's trainer_state.json (a run stopped after a checkpoint)."""
    for name in ("metrics.json", "log_history.json"):
        p = run_dir / name
        if p.is_file():
            data = json.loads(p.read_text())
            return data["log_history"] if isinstance(data, dict) else data
    ckpts = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if ckpts:
        return json.loads((ckpts[-1] / "trainer_state.json").read_text())["log_history"]
    return []


def _peak_rss(log: Path) -> str:
    if not log.is_file():
        return "-"
    text = log.read_text(errors="replace")
    m = re.search(r"Maximum resident set size \(kbytes\): (\d+)", text)
    w = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): ([\d:.]+)", text)
    return (f"{int(m.group(1)) / 1024 / 1024:.1f} GiB" if m else "-") + (f", wall {w.group(1)}" if w else "")


@functools.cache
def _locomo(ids: tuple[str, ...], n_sessions: int) -> tuple:
    """LoCoMo conversations ``ids`` cut to their first ``n_sessions`` sessions, loaded once per report."""
    from data_synth.datasets import load_conversations

    return tuple(load_conversations("locomo", None, ids=list(ids), n_sessions=n_sessions))


def _heldout_copy(h: dict) -> dict:
    """:func:`training.heldout.core_copy_stats` of a held-out measurement (its conversations,
    first ``h["sessions"]`` sessions, 1 for measurements made before that field existed)."""
    from training.heldout import core_copy_stats

    return core_copy_stats(h["outputs"], _locomo(tuple(sorted(h["outputs"])), h.get("sessions", 1)))


def plot_curves(sft: list[dict], fmt_steps: list[tuple[int, dict]], adrpo: list[dict], path: Path,
                by_adrpo_step: list[tuple[int, dict]] | None = None) -> None:
    """Three panels: SFT loss by step (train per step, eval on train probe and conv-30); the
    format-failure rate per manager of the SFT checkpoints on the validation rows, or, when
    ``by_adrpo_step`` (``[(ADRPO step, measurement)]``, SFT = step 0) is given, the greedy
    validation reward, the held-out answer recall and the held-out core format-failure rate of
    the ADRPO checkpoints; ADRPO reward parts by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    ax = axes[0]
    tr = [(h["step"], h["loss"]) for h in sft if "loss" in h]
    if tr:
        ax.plot(*zip(*tr), color="tab:blue", alpha=0.6, label="train loss")
    for key, c, name in (("eval_train_loss", "tab:green", "eval: train probe"),
                         ("eval_valid_loss", "tab:red", "eval: conv-30 (validation)")):
        pts = [(h["step"], h[key]) for h in sft if key in h]
        if pts:
            ax.plot(*zip(*pts), "o--", color=c, label=name)
    ax.set(xlabel="SFT step", ylabel="nats / completion token", title="SFT loss")
    ax.legend(fontsize=8)
    ax = axes[1]
    if by_adrpo_step:
        for name, get, style in (("validation reward (conv-30 rows)", lambda r: r.get("validation", {}).get("reward"), "o-"),
                                 ("held-out answer recall", lambda r: r.get("heldout", {}).get("answer_recall"), "s-"),
                                 ("held-out core format failures",
                                  lambda r: r.get("heldout", {}).get("format_failure_rate", {}).get("core"), "x--")):
            pts = [(st, get(r)) for st, r in by_adrpo_step if get(r) is not None]
            if pts:
                ax.plot(*zip(*pts), style, label=name)
        ax.set(xlabel="ADRPO step (0 = the SFT model)", ylabel="greedy decoding", ylim=(-0.03, 1.03),
               title="ADRPO checkpoints: validation vs held-out")
        ax.legend(fontsize=8)
        fmt_steps = []
    for m in MANAGERS:
        pts = [(s, r[m]) for s, r in fmt_steps if r.get(m) is not None]
        if pts:
            ax.plot(*zip(*pts), "o-", label=m)
    if not by_adrpo_step:
        ax.set(xlabel="SFT step", ylabel="format-failure rate", title="format failures (conv-30 rows, greedy)",
               ylim=(-0.03, 1.03))
        ax.legend(fontsize=8)
    ax = axes[2]
    rows = [h for h in adrpo if "reward_parts/reward" in h]
    for part, style in (("reward", "o-"), ("gate", "s--"), ("acc", "^--"), ("lp", "x:"), ("copy", "d:")):
        if rows and all(f"reward_parts/{part}" in h for h in rows):
            ax.plot([h["step"] for h in rows], [h[f"reward_parts/{part}"] for h in rows], style, label=part)
    ax.set(xlabel="ADRPO step", ylabel="mean over the step's completions", title="ADRPO reward (conv-26 rows)",
           ylim=(-0.03, 1.03))
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


PROGRAM_LABELS = ("turns", "base", "sft", "adrpo")


def program_table(out: Path) -> list[str]:
    """Markdown lines for ``<out>/program/<label>/report.json`` (``memgym program eval`` of an evolved
    program with each extractor, launch/recipes/program_trained_locomo.yaml): overall and per-capability
    answer-recall, units, manager outputs that failed / all, segments built; [] when none ran."""
    reps = {k: json.loads(f.read_text()) for k in PROGRAM_LABELS if (f := out / "program" / k / "report.json").is_file()}
    if not reps:
        return []
    first = next(iter(reps.values()))
    caps = ("F", "T", "P", "M", "A")
    cfg = next((r["config"] for r in reps.values() if r["extraction"]["mode"] == "extractor"), first["config"])
    lines = ["", f"## The extractor inside an evolved program (`memgym program eval {first['program']}`)", "",
             f"LoCoMo {', '.join(first.get('conversations', []))}, first {cfg.get('n_sessions')} session(s), "
             f"{first['n']} QA; plan {cfg.get('plan_mode')}, scorer {cfg.get('scorer')} of the retrieved text cut to "
             f"{cfg.get('context_tokens')} tokens (the settings the program was evolved with); model extractors on "
             f"segments of {cfg.get('extractor_segment_tokens')} tokens, {cfg.get('extractor_max_new_tokens')} tokens "
             "per output. A capability with no question in these sessions is '-'.", "",
             "| extraction | overall | " + " | ".join(caps) + " | units | failed manager outputs | segments |",
             "|---" * (len(caps) + 5) + "|"]
    for k, r in reps.items():
        ex = r["extraction"]
        outputs = 4 * ex["segments"] if ex["mode"] == "extractor" else 0
        failed = f"{ex['failed_manager_outputs']} / {outputs}" if outputs else "-"
        bc = r["by_capability"]
        lines.append(f"| {k} (`{r['config']['extractor']}`) | {_f(r['overall'])} | " +
                     " | ".join(_f(bc[c]['score']) if c in bc else "-" for c in caps) +
                     f" | {ex['units']} | {failed} | {ex['segments']} |")
    return lines


def report(a) -> int:
    out = Path(a.out)
    rows = {}
    for p in sorted((out / "measure").glob("*.json")):
        rows[p.stem] = json.loads(p.read_text())
    sft_hist = _history(out / "sft")
    adrpo_hist = _history(out / "adrpo")
    steps = dict(s.split("=") for s in a.steps)
    fmt_steps = sorted((int(steps[k]), r["validation"]["format_failure_rate"]) for k, r in rows.items()
                       if k in steps and "validation" in r)
    ad_steps = dict(x.split("=") for x in a.adrpo_steps)
    by_adrpo = sorted((int(ad_steps[k]), r) for k, r in rows.items() if k in ad_steps)
    plot_curves(sft_hist, fmt_steps, adrpo_hist, out / "curves.png", by_adrpo)
    lines = ["# memgym CPU training: SFT → ADRPO on SmolLM2-135M, measured on held-out conversations", "",
             "Recipes: `launch/recipes/train_cpu_sft.yaml`, `launch/recipes/train_cpu_adrpo.yaml`; measurements "
             "`scripts/train_cpu.py measure`; this file `scripts/train_cpu.py report`.", "",
             "Peak RSS / wall (`/usr/bin/time -v`, one entry per log: a resumed stage has one log per piece): SFT "
             + "; ".join(_peak_rss(p) for p in sorted(out.glob("sft*.log"))) + "; ADRPO "
             + "; ".join(_peak_rss(p) for p in sorted(out.glob("adrpo*.log"))) + ".", "",
             "## Held-out: LoCoMo conv-41 and conv-42 (never trained on), first session, free greedy decoding", "",
             "Same answer model (`hf:smollm2`) and retriever (all-MiniLM-L6-v2, top 10) for every row; F1 is LoCoMo's "
             "official token F1; answer recall = share of each gold answer's stemmed tokens in the retrieved memory.",
             "", "| extractor | core | episodic | semantic | procedural | all | bank entries (E+S+P) | core chars | "
             "core copy rate | answer recall | LoCoMo F1 | QA |", "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for k in a.table:
        h = rows.get(k, {}).get("heldout")
        if not h:
            continue
        ffr = h["format_failure_rate"]
        k_shown = k + (f", segments of {h['segment_tokens']}" if h.get("segment_tokens") else ", whole sessions")
        core_chars = sum(b["core_chars"] for b in h["bank"].values())
        cp = _heldout_copy(h)
        lines.append(f"| {k_shown} (`{rows[k]['spec']}`) | " + " | ".join(_f(ffr[m], 2) for m in MANAGERS) +
                     f" | {_f(h['format_failure_overall'], 2)} | {h['bank_entries']} | {core_chars} | "
                     f"{_f(cp['mean'], 2)} ({cp['n']}) | {_f(h['answer_recall'])} | {_f(h['f1'])} | {h['n_qa']} |")
    lines += ["", "Format-failure columns: failed outputs / outputs of that manager (one output per manager per "
              "segment built). Core copy rate: mean share of a core write's words inside a 6-word run copied from "
              "the session transcript or repeated within the write (`training.heldout.core_copy_stats`; in "
              "brackets the core outputs that write text); the expert's conv-26 core writes: 0.044.",
              "", "## Validation: conv-30 expert sessions (mean dense session reward of the greedy output)", "",
              "| extractor | rows | reward | gate | acc | LP | reward by manager | format failures per manager | n |",
              "|---|---|---|---|---|---|---|---|---|"]
    ref = None
    for k in a.table:
        v = rows.get(k, {}).get("validation")
        if not v:
            continue
        bym = ", ".join(f"{m} {_f(x, 2)}" for m, x in v["by_manager"].items())
        ffr = ", ".join(f"{m} {_f(x, 2)}" for m, x in v["format_failure_rate"].items() if x is not None)
        unit = f"segments of {v['segment_tokens']} tokens" if v.get("segment_tokens") else "whole sessions"
        lines.append(f"| {k} | {unit} | {_f(v['reward'])} | {_f(v['gate'], 2)} | {_f(v['acc'])} | {_f(v['lp'])} | "
                     f"{bym} | {ffr} | {v['n']} |")
        ref = v.get("do_nothing") or ref
    if ref:
        lines += ["", f"Reference: the outputs that change nothing (core NONE, empty operation lists) score "
                      f"{_f(ref['reward'])} on the same rows (" + ", ".join(f"{m} {_f(x, 3)}" for m, x in
                                                                          ref["by_manager"].items()) +
                  "): with the counterfactual bank the other parts are the expert's, so a reward is only a gain "
                  "where it exceeds this."]
    lines += ["", "## Curves", "", "![curves](curves.png)", "",
              "Format failures by SFT step (validation rows, greedy):", "", "| step | " + " | ".join(MANAGERS) + " |",
              "|---|---|---|---|---|"]
    for s, r in fmt_steps:
        lines.append(f"| {s} | " + " | ".join(_f(r.get(m), 2) for m in MANAGERS) + " |")
    ev = [(h["step"], h.get("eval_train_loss"), h.get("eval_valid_loss")) for h in sft_hist
          if "eval_valid_loss" in h or "eval_train_loss" in h]
    if ev:
        lines += ["", "SFT eval loss (nats / completion token):", "", "| step | train probe | conv-30 |", "|---|---|---|"]
        merged: dict[int, list] = {}
        for s, t, v in ev:
            cur = merged.setdefault(s, [None, None])
            cur[0] = t if t is not None else cur[0]
            cur[1] = v if v is not None else cur[1]
        lines += [f"| {s} | {_f(t)} | {_f(v)} |" for s, (t, v) in sorted(merged.items())]
    ad = [h for h in adrpo_hist if "reward_parts/reward" in h]
    if ad:
        lines += ["", "ADRPO steps (conv-26 rows; copy = mean core copy rate CP of the step's completions, "
                  "'-' in runs logged before it existed):", "", "| step | reward | gate | acc | LP | copy | reward std | "
                  "frac zero-std | kl |", "|---|---|---|---|---|---|---|---|---|"]
        lines += [f"| {h['step']} | {_f(h['reward_parts/reward'])} | {_f(h['reward_parts/gate'], 2)} | "
                  f"{_f(h['reward_parts/acc'])} | {_f(h['reward_parts/lp'])} | {_f(h.get('reward_parts/copy'))} | "
                  f"{_f(h.get('reward_std'))} | "
                  f"{_f(h.get('frac_reward_zero_std'), 2)} | {_f(h.get('kl'), 4)} |" for h in ad]
    lines += program_table(out)
    if a.notes and Path(a.notes).is_file():
        lines += ["", Path(a.notes).read_text()]
    (out / "report.md").write_text("\n".join(lines) + "\n")
    print((out / "report.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="train_cpu", description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("measure", help="measure one extractor (validation reward + held-out table row)")
    m.add_argument("label")
    m.add_argument("spec", help="extractor backend spec, e.g. hf:smollm2 or hf:runs/train_cpu/sft")
    m.add_argument("--out", default="runs/train_cpu")
    m.add_argument("--conversations", nargs="+", default=["conv-41", "conv-42"])
    m.add_argument("--sessions", type=int, default=1, help="first N sessions of each held-out conversation")
    m.add_argument("--answer-model", default="hf:smollm2")
    m.add_argument("--max-new-tokens", type=int, default=640, help="tokens per manager output")
    m.add_argument("--segment-tokens", type=int, default=None,
                   help="build each held-out session in segments of at most this many transcript tokens, the cut "
                        "of the SFT recipe's segment_tokens, and score the validation reward on segment rows "
                        "(training.segment_samples) (default: whole sessions)")
    m.add_argument("--val-trajectories", nargs="+", default=["conv-30"])
    m.add_argument("--val-sessions", type=int, nargs="+", default=[1, 2])
    m.add_argument("--val-max-prompt-tokens", type=int, default=1600)
    m.add_argument("--validation-only", action="store_true")
    m.add_argument("--heldout-only", action="store_true", help="skip the validation reward (measure it later)")
    m.add_argument("--batch-size", type=int, default=8)
    m.add_argument("--cache", default=None, help="response cache sqlite path; 'none' disables")
    r = sub.add_parser("report", help="write <out>/report.md and curves.png from the measurements")
    r.add_argument("--out", default="runs/train_cpu")
    r.add_argument("--table", nargs="+", default=["base", "sft", "adrpo-step-6", "adrpo-step-8", "adrpo"],
                   help="measurement labels, in row order (a label not measured is left out)")
    r.add_argument("--steps", nargs="*", default=[], help="LABEL=STEP pairs for the format-failure-by-step curve")
    r.add_argument("--adrpo-steps", nargs="*", default=[],
                   help="LABEL=ADRPO_STEP pairs (e.g. sft=0 adrpo-step-6=6 adrpo=12): the middle panel then plots "
                        "validation reward, held-out recall and core format failures by ADRPO step")
    r.add_argument("--notes", default=None, help="a Markdown file appended to the report")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return measure(a) if a.cmd == "measure" else report(a)


if __name__ == "__main__":
    sys.exit(main())
