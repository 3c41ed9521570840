"""The ADRPO weighting comparison at CPU scale (issue 17 item 3): ``weighting: advantage``
(corrected), ``unclipped`` (the paper's Eq. 12) and ``none`` (uniform w = 1), the same budget and
seeds, from the SFT model of ``launch/recipes/train_cpu_sft.yaml``.

Three subcommands, each restartable (a finished piece is a file that is never redone):

``screen``: the pre-screen that picks rows with reward variance. GRPO learns nothing from a
group whose rollouts all score alike (zero reward std: zero advantage), so for every candidate
row of the recipe (its trajectories, managers, sessions, ``max_prompt_tokens``,
``segment_tokens``; its ``row_keys`` ignored) the policy (``--spec``, the SFT model) samples ``num_generations``
completions with the recipe's temperature / top_p / ``max_completion_length`` (seeds 0..n-1,
``llm.hf_backend`` sampling), the recipe's session reward scores them, and
``<out>/screen.json`` lists per row the rewards, gates and their std. It prints the
``row_keys:`` line (rows with std > ``--min-std``) for the recipe.

``run``: for each weighting x seed, ``python -m training.adrpo --config RECIPE --init_from SFT
--weighting W --seed S --output_dir <out>/<W>-s<S>`` under ``/usr/bin/time -v``
(``<out>/<W>-s<S>.log``; resumed from its last checkpoint after a kill), then its validation
reward (``scripts/train_cpu.py measure --validation-only``: conv-30, greedy, the same rows as
SFT's; segment rows when the recipe sets ``segment_tokens``) into ``<out>/measure/<W>-s<S>.json``. ``--parallel 2`` runs two at once.

``report``: ``<out>/weighting.md`` (per step reward, reward std, zero-std fraction of every
run; the table of mean and seed-to-seed spread) and ``<out>/weighting.png`` (side by side).

Usage (``make adrpo-weighting`` runs all three after ``make train-cpu``'s SFT stage)::

    python scripts/adrpo_weighting.py screen --spec hf:runs/train_cpu/sft
    python scripts/adrpo_weighting.py run --parallel 2 [--row-keys-from runs/adrpo_weighting/screen.json]
    python scripts/adrpo_weighting.py report
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

RECIPE = "launch/recipes/train_cpu_adrpo.yaml"
WEIGHTINGS = ("advantage", "unclipped", "none")


def _write_atomic(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(obj, indent=2) + "\n")
    os.replace(tmp, path)


def _std(xs: list[float]) -> float:
    """Population std (0 for < 2 values); a group is 'zero-std' when this is 0, as in TRL."""
    return statistics.pstdev(xs) if len(xs) > 1 else 0.0


# ---------------------------------------------------------------- screen

def screen(a) -> int:
    from llm.base import GenerationParams
    from llm.embeddings import load_embedder
    from llm.runtime import Runtime
    from training.adrpo import build_reward, parse_args, reward_rows, trajectory_paths
    from training.adrpo_data import prompt_tokens, select_samples
    from training.common import load_tokenizer, resolve_model_path

    args, _ = parse_args(["--config", a.config])
    path = Path(a.out) / "screen.json"
    done = json.loads(path.read_text()) if path.is_file() else {"spec": a.spec, "rows": {}}
    tok = load_tokenizer(resolve_model_path("smollm2"))
    emb = load_embedder(args.embedder)
    samples = reward_rows(args, trajectory_paths(args.train_trajectories), tokenizer=tok, embedder=emb)
    sessions = args.sessions if a.sessions is None else (a.sessions or None)  # --sessions with no value: all
    max_tokens = args.max_prompt_tokens if a.max_prompt_tokens is None else a.max_prompt_tokens
    samples = select_samples(samples, sessions=sessions, max_prompt_tokens=max_tokens, tokenizer=tok)
    rt = Runtime.from_config(cache=a.cache, batch_size=a.batch_size)
    reward = build_reward(args, tok, emb, rt)
    backend = rt.backend(a.spec, role="extractor")
    todo = [s for s in samples if s.key not in done["rows"]]
    t = time.time()
    texts: dict[str, list] = {s.key: [] for s in todo}
    for seed in range(args.num_generations):
        params = GenerationParams(max_new_tokens=args.max_completion_length, temperature=args.temperature,
                                  top_p=args.top_p, seed=seed)
        comps = backend.generate([s.messages for s in todo], params) if todo else []
        for s, c in zip(todo, comps):
            texts[s.key].append(c)
    for s in todo:
        comps = texts[s.key]
        bds = reward([s] * len(comps), [c.text for c in comps], finish_reasons=[c.finish_reason for c in comps])
        rs = [round(b.reward, 4) for b in bds]
        done["rows"][s.key] = {"prompt_tokens": prompt_tokens(tok, s.messages), "rewards": rs,
                               "gates": [b.gate for b in bds], "acc": [round(b.acc, 4) for b in bds],
                               "finish": [c.finish_reason for c in comps], "std": round(_std(rs), 4),
                               "mean": round(statistics.fmean(rs), 4), "weights": [b.weight for b in bds],
                               "texts": [c.text for c in comps]}
        print(f"{s.key}: rewards {rs} std {done['rows'][s.key]['std']}", flush=True)
    done["wall_s"] = round(done.get("wall_s", 0) + time.time() - t, 1)
    done["settings"] = {"temperature": args.temperature, "top_p": args.top_p, "n": args.num_generations,
                        "max_completion_length": args.max_completion_length}
    by_key = {s.key: s for s in samples}
    for k, r in done["rows"].items():  # a screen.json written before weights were recorded: rescore its texts
        if "weights" not in r and k in by_key:
            r["weights"] = [b.weight for b in reward([by_key[k]] * len(r["texts"]), r["texts"],
                                                     finish_reasons=r["finish"])]
    keys = [k for k, r in done["rows"].items() if r["std"] > a.min_std
            and (not a.weighted_only or any(w != 1.0 for w in r.get("weights", [])))]
    done["selected"] = keys
    done["weighted_only"] = a.weighted_only
    _write_atomic(path, done)
    extra = " and a rollout with w(m) != 1" if a.weighted_only else ""
    print(f"{len(keys)} of {len(done['rows'])} rows have reward std > {a.min_std}{extra}; for the recipe:")
    print("row_keys: [" + ", ".join(keys) + "]")
    return 0


# ---------------------------------------------------------------- run

def _run_cmd(a, w: str, seed: int) -> tuple[list[str], Path, Path]:
    out = Path(a.out)
    run_dir = out / f"{w}-s{seed}"
    cmd = ["/usr/bin/time", "-v", sys.executable, "-m", "training.adrpo", "--config", a.config,
           "--init_from", a.sft, "--weighting", w, "--seed", str(seed), "--output_dir", str(run_dir)]
    if a.max_steps:
        cmd += ["--max_steps", str(a.max_steps)]
    if a.row_keys_from:
        cmd += ["--row_keys", *screened_keys(Path(a.row_keys_from))]
    if list(run_dir.glob("checkpoint-*")):
        cmd += ["--resume_from_checkpoint", "true"]
    return cmd, run_dir, out / f"{w}-s{seed}.log"


def screened_keys(path: Path) -> list[str]:
    """The ``selected`` row keys of a ``screen`` output. Raises SystemExit naming the file when
    it is missing or selected nothing (every group would have zero std: ADRPO would not move)."""
    if not path.is_file():
        raise SystemExit(f"adrpo_weighting run: --row-keys-from {path}: no such file (run the screen first)")
    keys = json.loads(path.read_text()).get("selected") or []
    if not keys:
        raise SystemExit(f"adrpo_weighting run: {path} selected no row (every screened row had reward std 0): "
                         "ADRPO would get no gradient; screen more rows (--sessions, --max-prompt-tokens)")
    return keys


def _validate(a, label: str, run_dir: Path) -> list[str]:
    """The validation measurement of one run: on segment rows when the recipe trains on them
    (its ``segment_tokens``), as the SFT model's validation was measured."""
    import yaml

    seg = (yaml.safe_load(Path(a.config).read_text()) or {}).get("segment_tokens")
    return [sys.executable, str(REPO / "scripts" / "train_cpu.py"), "measure", label, f"hf:{run_dir}",
            "--out", a.out, "--validation-only"] + (["--segment-tokens", str(seg)] if seg else [])


def identity_adapter(run_dir: Path) -> bool:
    """True when every ``lora_B`` tensor of ``run_dir/adapter_model.safetensors`` is exactly 0.

    PEFT initialises LoRA B to zero, and a step whose groups all have zero reward std has zero
    advantages, zero KL gradient (the policy equals its reference) and so a zero update: an
    adapter that never saw a gradient is still the identity and the model equals its
    ``--init_from`` bit for bit, so its greedy validation outputs are the init's."""
    from safetensors.torch import load_file

    tensors = load_file(str(run_dir / "adapter_model.safetensors"))
    bs = [t for k, t in tensors.items() if "lora_B" in k]
    return bool(bs) and all(not t.any() for t in bs)


def _copy_init_validation(a, label: str, run_dir: Path) -> bool:
    """For an identity adapter, write ``<out>/measure/<label>.json`` with the validation of the
    init (``--init-measure``, a ``train_cpu.py measure`` file) instead of re-decoding it."""
    init = Path(a.init_measure) if a.init_measure else None
    if init is None or not init.is_file() or not identity_adapter(run_dir):
        return False
    v = json.loads(init.read_text())["validation"]
    _write_atomic(Path(a.out) / "measure" / f"{label}.json",
                  {"validation": v, "label": label, "spec": f"hf:{run_dir}", "identity_adapter": True,
                   "validation_from": str(init)})
    print(f"{label}: every lora_B is 0 (no gradient in any step): validation = {init}'s", flush=True)
    return True


def run(a) -> int:
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"), "PYTHONPATH": str(REPO)}
    jobs = []
    for w in a.weightings:
        for seed in a.seeds:
            jobs.append((w, seed))
    running: list[tuple[subprocess.Popen, str, int, str]] = []

    def start(w: str, seed: int) -> None:
        cmd, run_dir, log = _run_cmd(a, w, seed)
        label = f"{w}-s{seed}"
        if (run_dir / "adapter_model.safetensors").is_file():
            if (a.no_validate or (Path(a.out) / "measure" / f"{label}.json").is_file()
                    or _copy_init_validation(a, label, run_dir)):
                return
            cmd, stage = _validate(a, label, run_dir), "validate"
        else:
            stage = "train"
        log.parent.mkdir(parents=True, exist_ok=True)
        fh = open(log if stage == "train" else log.with_suffix(".validate.log"), "a")
        print(f"start {label} ({stage}): {' '.join(cmd)}", flush=True)
        running.append((subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=REPO), w, seed,
                        stage))

    pending = list(jobs)
    while pending or running:
        while pending and len(running) < a.parallel:
            start(*pending.pop(0))
        if not running:
            continue
        time.sleep(5)
        for item in list(running):
            proc, w, seed, stage = item
            if proc.poll() is None:
                continue
            running.remove(item)
            print(f"done {w}-s{seed} ({stage}): exit {proc.returncode}", flush=True)
            if proc.returncode != 0:
                print(f"{w}-s{seed}: {stage} failed, see its log", file=sys.stderr)
                return proc.returncode
            if stage == "train":
                pending.insert(0, (w, seed))  # its validation next
    return 0


# ---------------------------------------------------------------- report

def _history(run_dir: Path) -> list[dict]:
    """The per-step log rows (those with ``reward``) of a run: its latest checkpoint's
    ``trainer_state.json`` (the recipe saves the last step)."""
    ckpts = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if not ckpts:
        return []
    return [h for h in json.loads((ckpts[-1] / "trainer_state.json").read_text())["log_history"] if "reward" in h]


def _adapter_id(run_dir: Path) -> str:
    """First 12 hex digits of the adapter file's sha256 (equal digits: bit-identical adapters),
    plus ``identity`` when every lora_B is 0; ``-`` before the run saved one."""
    import hashlib

    f = run_dir / "adapter_model.safetensors"
    if not f.is_file():
        return "-"
    return hashlib.sha256(f.read_bytes()).hexdigest()[:12] + (" identity" if identity_adapter(run_dir) else "")


def _mean_spread(xs: list[float]) -> str:
    """``mean ± half-range`` over seeds (with 2 seeds the half-range is |x0 - x1| / 2)."""
    if not xs:
        return "-"
    return f"{statistics.fmean(xs):.3f} ± {(max(xs) - min(xs)) / 2:.3f}"


def plot(runs: dict[str, list[dict]], val: dict[str, float], sft_val: float | None, weightings, seeds,
         path: Path) -> None:
    """Three panels: training reward by step, reward std by step (each weighting one colour,
    one line style per seed), validation reward per run (points) with the SFT line."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"advantage": "tab:blue", "unclipped": "tab:orange", "none": "tab:green"}
    styles = ["o-", "s--", "^:", "x-."]
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for w in weightings:
        for j, seed in enumerate(seeds):
            h = runs.get(f"{w}-s{seed}", [])
            if not h:
                continue
            steps = [r["step"] for r in h]
            axes[0].plot(steps, [r["reward"] for r in h], styles[j % 4], color=colours.get(w), label=f"{w} seed {seed}")
            axes[1].plot(steps, [r.get("reward_std", 0.0) for r in h], styles[j % 4], color=colours.get(w),
                         label=f"{w} seed {seed}")
    axes[0].set(xlabel="ADRPO step", ylabel="mean reward of the step's rollouts", title="training reward", ylim=(-0.03, 1.03))
    axes[1].set(xlabel="ADRPO step", ylabel="reward std within the group", title="reward std (0: no gradient)")
    for i, w in enumerate(weightings):
        ys = [val[f"{w}-s{s}"] for s in seeds if f"{w}-s{s}" in val]
        axes[2].plot([i] * len(ys), ys, "o", color=colours.get(w), markersize=8)
        if ys:
            axes[2].hlines(statistics.fmean(ys), i - 0.25, i + 0.25, color=colours.get(w))
    if sft_val is not None:
        axes[2].axhline(sft_val, color="grey", ls="--", label=f"init (SFT) {sft_val:.3f}")
        axes[2].legend(fontsize=8)
    axes[2].set(xticks=range(len(weightings)), xticklabels=list(weightings), ylabel="mean session reward (greedy)",
                title="validation reward (conv-30), one point per seed")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(a) -> int:
    out = Path(a.out)
    runs = {f"{w}-s{s}": _history(out / f"{w}-s{s}") for w in a.weightings for s in a.seeds}
    val = {}
    for label in runs:
        p = out / "measure" / f"{label}.json"
        if p.is_file():
            val[label] = json.loads(p.read_text())["validation"]["reward"]
    sft_p = Path(a.sft_measure)
    sft_val = json.loads(sft_p.read_text())["validation"]["reward"] if sft_p.is_file() else None
    plot(runs, val, sft_val, a.weightings, a.seeds, out / "weighting.png")
    lines = ["# ADRPO weighting comparison (CPU, SmolLM2-135M LoRA from the SFT model)", "",
             f"Recipe `{a.config}`, `scripts/adrpo_weighting.py`. Validation reward: conv-30 rows, greedy "
             f"(`scripts/train_cpu.py measure --validation-only`); the init's ({a.sft_measure}): {sft_val if sft_val is None else round(sft_val, 3)}.",
             "", "![weighting](weighting.png)", "",
             "| weighting | seed | steps | reward by step | reward std by step | frac zero-std by step | "
             "mean w(m) the reward computed, by step (none trains with w = 1) | mean train reward | validation reward | adapter sha256[:12] (identity: every "
             "lora_B 0) | peak RSS / wall |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    from scripts.train_cpu import _peak_rss

    for label, h in runs.items():
        w, s = label.rsplit("-s", 1)
        fmt = lambda key: " ".join(f"{r.get(key, 0.0):.3f}" for r in h)  # noqa: E731
        mean_r = statistics.fmean([r["reward"] for r in h]) if h else None
        lines.append(f"| {w} | {s} | {len(h)} | {fmt('reward')} | {fmt('reward_std')} | "
                     f"{fmt('frac_reward_zero_std')} | {fmt('reward_parts/weight')} | "
                     f"{'-' if mean_r is None else f'{mean_r:.3f}'} | "
                     f"{val.get(label, '-') if label not in val else f'{val[label]:.3f}'} | {_adapter_id(out / label)} | "
                     f"{_peak_rss(out / f'{label}.log')} |")
    lines += ["", "Mean over seeds ± half the seed-to-seed range:", "",
              "| weighting | mean train reward | mean train reward std | validation reward | validation − init |",
              "|---|---|---|---|---|"]
    for w in a.weightings:
        tr = [statistics.fmean([r["reward"] for r in runs[f"{w}-s{s}"]]) for s in a.seeds if runs[f"{w}-s{s}"]]
        sd = [statistics.fmean([r.get("reward_std", 0.0) for r in runs[f"{w}-s{s}"]]) for s in a.seeds
              if runs[f"{w}-s{s}"]]
        vs = [val[f"{w}-s{s}"] for s in a.seeds if f"{w}-s{s}" in val]
        delta = [v - sft_val for v in vs] if sft_val is not None else []
        lines.append(f"| {w} | {_mean_spread(tr)} | {_mean_spread(sd)} | {_mean_spread(vs)} | {_mean_spread(delta)} |")
    if a.notes and Path(a.notes).is_file():
        lines += ["", Path(a.notes).read_text()]
    (out / "weighting.md").write_text("\n".join(lines) + "\n")
    print((out / "weighting.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adrpo_weighting", description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("screen", "run", "report"):
        q = sub.add_parser(name)
        q.add_argument("--config", default=RECIPE, help="the ADRPO recipe")
        q.add_argument("--out", default="runs/adrpo_weighting")
        if name == "screen":
            q.add_argument("--spec", default="hf:runs/train_cpu/sft", help="the policy that samples (the SFT model)")
            q.add_argument("--sessions", type=int, nargs="*", default=None,
                           help="candidate sessions (default the recipe's; with no value: every session)")
            q.add_argument("--max-prompt-tokens", type=int, default=None,
                           help="candidate rows' prompt cap (default the recipe's max_prompt_tokens)")
            q.add_argument("--min-std", type=float, default=0.0, help="rows with reward std above this are selected")
            q.add_argument("--weighted-only", action="store_true",
                           help="select only rows where some rollout has w(m) != 1 (the row's part is dominant): "
                                "elsewhere advantage, unclipped and none are the same update")
            q.add_argument("--batch-size", type=int, default=8)
            q.add_argument("--cache", default=None, help="response cache sqlite path; 'none' disables")
        else:
            q.add_argument("--weightings", nargs="+", default=list(WEIGHTINGS))
            q.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
        if name == "run":
            q.add_argument("--sft", default="runs/train_cpu/sft", help="the SFT output dir (--init_from)")
            q.add_argument("--max-steps", type=int, default=None, help="override the recipe's max_steps")
            q.add_argument("--row-keys-from", default=None,
                           help="a screen.json: train on its selected rows instead of the recipe's row_keys")
            q.add_argument("--no-validate", action="store_true",
                           help="train only (the report then has the training reward curves, no validation column)")
            q.add_argument("--parallel", type=int, default=1, help="runs at once (each peaked at 8.2-8.9 GiB RSS at micro-batch 2)")
            q.add_argument("--init-measure", default="runs/train_cpu/measure/sft.json",
                           help="the init's train_cpu.py measure file: an identity adapter reuses its validation")
        if name == "report":
            q.add_argument("--sft-measure", default="runs/train_cpu/measure/sft.json",
                           help="scripts/train_cpu.py measure output of the SFT model (its validation reward)")
            q.add_argument("--notes", default=None, help="a Markdown file appended to the report")
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return {"screen": screen, "run": run, "report": report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
