"""The ADRPO weighting comparison at CPU scale: ``weighting: advantage`` (corrected),
``unclipped`` (the paper's Eq. 12) and ``none`` (uniform w = 1), the same budget and seeds, from a
content-only SFT model. README.md beside this file has the question, command and result.

``screen``: the pre-screen that picks rows with reward variance. GRPO learns nothing from a
group whose rollouts all score alike (zero reward std: zero advantage), so for every candidate
row of the recipe (its trajectories, managers, sessions, ``max_prompt_tokens``,
``segment_tokens``; its ``row_keys`` ignored) the policy (``--spec``, the SFT model) samples
``num_generations`` completions with the recipe's temperature / top_p / ``max_completion_length``
(seeds 0..n-1), the recipe's session reward scores them, and ``<out>/screen.json`` lists per row
the rewards, gates, w(m) and their std. Restartable: screened rows are kept. It prints the
``row_keys:`` line (rows with std > ``--min-std``; ``--weighted-only``: and a rollout with w != 1).

``report``: ``<out>/weighting.md`` (per step reward, reward std, zero-std fraction and mean w(m)
of every ``<out>/<weighting>-s<seed>`` run; mean and seed-to-seed spread) and
``<out>/weighting.png`` (training reward and reward std by step, side by side).
The training runs themselves are ``memgym train adrpo`` calls (``make adrpo-weighting``).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
RECIPE = str(HERE / "train_cpu_adrpo_weighting.yaml")
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
    from memgym.llm.base import GenerationParams
    from memgym.llm.embeddings import load_embedder
    from memgym.llm.runtime import Runtime
    from memgym.training.adrpo import build_reward, parse_args
    from memgym.training.adrpo_data import prompt_tokens
    from memgym.training.reward_rows import reward_rows
    from memgym.training.common import load_tokenizer, resolve_model_path

    sargs, rargs, args, _ = parse_args(["--config", a.config])
    path = Path(a.out) / "screen.json"
    done = json.loads(path.read_text()) if path.is_file() else {"spec": a.spec, "rows": {}}
    tok = load_tokenizer(resolve_model_path("smollm2"))
    emb = load_embedder(sargs.embedder)
    sessions = sargs.sessions if a.sessions is None else (a.sessions or None)  # --sessions with no value: all
    max_tokens = sargs.max_prompt_tokens if a.max_prompt_tokens is None else a.max_prompt_tokens
    samples = reward_rows(sargs.train_trajectories, tokenizer=tok, embedder=emb, managers=sargs.managers,
                          segment_tokens=sargs.segment_tokens, dataset=sargs.dataset, data_path=sargs.data_path,
                          qa_path=sargs.qa_path, sessions=sessions, max_prompt_tokens=max_tokens)
    rt = Runtime.from_config(cache=a.cache, batch_size=a.batch_size)
    reward = build_reward(sargs, rargs, tok, emb, rt)
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


# ---------------------------------------------------------------- report

def _history(run_dir: Path) -> list[dict]:
    """The per-step log rows (those with ``reward``) of a run: its latest checkpoint's
    ``trainer_state.json`` (the recipe saves the last step)."""
    ckpts = sorted(run_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))
    if not ckpts:
        return []
    return [h for h in json.loads((ckpts[-1] / "trainer_state.json").read_text())["log_history"] if "reward" in h]


def _mean_spread(xs: list[float]) -> str:
    """``mean ± half-range`` over seeds (with 2 seeds the half-range is |x0 - x1| / 2)."""
    if not xs:
        return "-"
    return f"{statistics.fmean(xs):.3f} ± {(max(xs) - min(xs)) / 2:.3f}"


def plot(runs: dict[str, list[dict]], weightings, seeds, path: Path) -> None:
    """Two panels: training reward and reward std by step (a colour per weighting, a line style
    per seed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = {"advantage": "tab:blue", "unclipped": "tab:orange", "none": "tab:green"}
    styles = ["o-", "s--", "^:", "x-."]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    for w in weightings:
        for j, seed in enumerate(seeds):
            h = runs.get(f"{w}-s{seed}", [])
            steps = [r["step"] for r in h]
            for ax, key in zip(axes, ("reward", "reward_std")):
                ax.plot(steps, [r.get(key, 0.0) for r in h], styles[j % 4], color=colours.get(w), label=f"{w} seed {seed}")
    axes[0].set(xlabel="ADRPO step", ylabel="mean reward of the step's rollouts", title="training reward", ylim=(-0.03, 1.03))
    axes[1].set(xlabel="ADRPO step", ylabel="reward std within the group", title="reward std (0: no gradient)")
    axes[0].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def report(a) -> int:
    import hashlib

    out = Path(a.out)
    runs = {f"{w}-s{s}": _history(out / f"{w}-s{s}") for w in a.weightings for s in a.seeds}
    plot(runs, a.weightings, a.seeds, out / "weighting.png")
    lines = ["# ADRPO weighting comparison (CPU, SmolLM2-135M LoRA from the SFT model)", "",
             f"Recipe `{a.config}`.", "", "![weighting](weighting.png)", "",
             "| weighting | seed | steps | reward by step | reward std by step | frac zero-std by step | "
             "mean w(m) by step (none trains with w = 1) | mean train reward | adapter sha256[:12] |",
             "|---|---|---|---|---|---|---|---|---|"]
    for label, h in runs.items():
        w, s = label.rsplit("-s", 1)
        fmt = lambda key: " ".join(f"{r.get(key, 0.0):.3f}" for r in h)  # noqa: E731
        mean_r = f"{statistics.fmean([r['reward'] for r in h]):.3f}" if h else "-"
        f = out / label / "adapter_model.safetensors"
        sha = hashlib.sha256(f.read_bytes()).hexdigest()[:12] if f.is_file() else "-"
        lines.append(f"| {w} | {s} | {len(h)} | {fmt('reward')} | {fmt('reward_std')} | "
                     f"{fmt('frac_reward_zero_std')} | {fmt('reward_parts/weight')} | {mean_r} | {sha} |")
    lines += ["", "Mean over seeds ± half the seed-to-seed range:", "",
              "| weighting | mean train reward | mean train reward std |", "|---|---|---|"]
    for w in a.weightings:
        hs = [runs[f"{w}-s{s}"] for s in a.seeds if runs[f"{w}-s{s}"]]
        tr = [statistics.fmean([r["reward"] for r in h]) for h in hs]
        sd = [statistics.fmean([r.get("reward_std", 0.0) for r in h]) for h in hs]
        lines.append(f"| {w} | {_mean_spread(tr)} | {_mean_spread(sd)} |")
    (out / "weighting.md").write_text("\n".join(lines) + "\n")
    print((out / "weighting.md").read_text())
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="adrpo-weighting", description=(__doc__ or "").split("\n\n")[0])
    sub = p.add_subparsers(dest="cmd", required=True)
    for name in ("screen", "report"):
        q = sub.add_parser(name)
        q.add_argument("--config", default=RECIPE, help="the ADRPO recipe")
        q.add_argument("--out", default="runs/adrpo_weighting")
    q = sub.choices["screen"]
    q.add_argument("--spec", default="hf:runs/sft_content/sft/checkpoint-104", help="the policy that samples (the SFT model)")
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
    q = sub.choices["report"]
    q.add_argument("--weightings", nargs="+", default=list(WEIGHTINGS))
    q.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    a = p.parse_args(argv)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    return {"screen": screen, "report": report}[a.cmd](a)


if __name__ == "__main__":
    sys.exit(main())
