"""Metrics and reports of an ablation experiment (:mod:`memgym.evolution.search.experiment`).

Per run (variant × seed), read back from its run directory: final valid/test scores, rounds,
candidates, calls and tokens per role, the boundary (PrisMem Fig. 3b), per-task test scores.

Per variant: mean ± std over seeds (sample std, 0 for one seed) of each number. Baselines in
the same table: the **seed program** (identical in every run) and PrisMem Table 12's
**oracle-label router** built from each capability-driven run: every test question is answered
by the specialist of its native capability label (an upper-bound reference, since a deployed
program never sees labels; a capability without a specialist uses the final program).

Noise: per variant and capability, the paired bootstrap 90% interval, over test tasks, of the
mean of d_t = (final score on t, averaged over seeds) − (seed program's score on t): 2,000
resamples, percentile method (``scipy.stats.bootstrap``), fixed RNG seed 0. A gain is
"outside" when its interval excludes 0.

Writes ``experiment.json`` (everything above), ``experiment.md`` and ``boundary.png``.
"""
from __future__ import annotations

import statistics
from pathlib import Path

import numpy as np

from memgym.evolution.search.archive import CAPABILITIES
from memgym.evolution.search.journal import load_archive
from memgym.evolution.search.report import capability_bars, test_of
from memgym.evolution.search.rundir import atomic_write_json, atomic_write_text, read_json
from memgym.memory_bank.schema import CAPABILITY_NAMES

N_RESAMPLES = 2000
CONFIDENCE = 0.90


def _defined(tasks: dict) -> dict:
    """``tasks`` without its undefined (NaN) scores."""
    return {t: v for t, v in tasks.items() if isinstance(v, (int, float)) and v == v}


def mean_std(xs: list[float]) -> dict | None:
    """``{"mean", "std", "n"}`` (sample std; 0.0 for one value); None for no values."""
    xs = [x for x in xs if x is not None]
    if not xs:
        return None
    return {"mean": statistics.fmean(xs), "std": statistics.stdev(xs) if len(xs) > 1 else 0.0, "n": len(xs)}


def bootstrap_interval(diffs: list[float], seed: int = 0) -> dict | None:
    """Percentile bootstrap 90% interval of the mean of ``diffs`` (paired differences):
    ``{"gain", "lo", "hi", "n", "outside"}``; None when empty. ``outside``: the interval
    excludes 0."""
    if not diffs:
        return None
    d = np.asarray(diffs, dtype=float)
    if np.allclose(d, d[0]):
        lo = hi = float(d[0])
    else:
        from scipy.stats import bootstrap
        res = bootstrap((d,), np.mean, confidence_level=CONFIDENCE, n_resamples=N_RESAMPLES, method="percentile",
                        random_state=np.random.default_rng(seed))
        lo, hi = float(res.confidence_interval.low), float(res.confidence_interval.high)
    gain = float(d.mean())
    return {"gain": gain, "lo": lo, "hi": hi, "n": int(d.size), "outside": bool(lo > 0 or hi < 0)}


def test_labels(cfg) -> dict[str, str]:
    """task id → native primary capability letter of every test task (unlabelled left out)."""
    return {f"{c.id}/{q.id}": q.capability.value for c in cfg.load_split("test") for q in c.questions
            if q.capability is not None}


def by_capability(tasks: dict[str, float], labels: dict[str, str]) -> dict[str, float]:
    out = {}
    for c in CAPABILITIES:
        xs = [s for t, s in tasks.items() if labels.get(t) == c]
        if xs:
            out[c] = sum(xs) / len(xs)
    return out


def run_metrics(run_dir: Path, labels: dict[str, str]) -> dict:
    """The numbers of one finished run (module doc)."""
    s = read_json(run_dir / "summary.json")
    fin = read_json(run_dir / "final.json") or {}
    arch = load_archive(run_dir)
    best = {}
    for c in arch.evaluated():
        for cap, v in c.valid.by_capability.items():
            best[cap] = max(best.get(cap, 0.0), v)
    out = {"valid": s["final"]["valid"], "test": s["final"]["test"], "seed_valid": s["seed"]["valid"],
           "seed_test": s["seed"]["test"], "rounds": s["rounds"], "candidates_evaluated": s["candidates_evaluated"],
           "proposals_failed": s["proposals_failed"], "wall_s": s["wall_s"], "model_calls": s["model_calls"],
           "tokens": s["tokens"], "final_id": s["final_id"], "integrated": s.get("integrated", False),
           "best_valid": best, "specialists": {c: v["id"] for c, v in s["specialists"].items()},
           "static_baselines": s.get("baselines") or {}}
    # undefined scores (NaN: no gold evidence under grounded-recall, an undefined BEAM tau) stay out of
    # every mean, the router's and the paired intervals' included, as in the run's own summary
    final_tasks = _defined((fin.get("final_test") or {}).get("tasks", {}))
    out["final_test_tasks"] = final_tasks
    out["seed_test_tasks"] = _defined((fin.get("seed_test") or {}).get("tasks", {}))
    if s["specialists"] and final_tasks:
        routed = {}
        for t, score in final_tasks.items():
            sid = out["specialists"].get(labels.get(t))
            st = test_of(fin, sid) if sid else None
            v = st["tasks"].get(t, score) if st else score
            if v == v:  # NaN is undefined, left out
                routed[t] = v
        out["router_test"] = {"overall": sum(routed.values()) / len(routed),
                              "by_capability": by_capability(routed, labels)}
    else:
        out["router_test"] = None
    return out


def _agg_scores(rows: list[dict | None]) -> dict | None:
    rows = [r for r in rows if r]
    if not rows:
        return None
    caps = [c for c in CAPABILITIES if any(c in r["by_capability"] for r in rows)]
    return {"overall": mean_std([r["overall"] for r in rows]),
            "by_capability": {c: mean_std([r["by_capability"].get(c) for r in rows]) for c in caps}}


def aggregate(runs: dict[str, dict[str, dict]], labels: dict[str, str]) -> dict:
    """Per variant: mean ± std over its finished seeds, and the (final − seed) intervals."""
    out = {}
    for v, seeds in runs.items():
        ms = list(seeds.values())
        if not ms:
            continue
        roles = sorted({r for m in ms for r in m["tokens"]})
        agg = {"seeds": len(ms), "valid": _agg_scores([m["valid"] for m in ms]),
               "test": _agg_scores([m["test"] for m in ms]),
               "router_test": _agg_scores([m["router_test"] for m in ms]),
               "best_valid": {c: mean_std([m["best_valid"].get(c) for m in ms]) for c in CAPABILITIES
                              if any(c in m["best_valid"] for m in ms)},
               "rounds": mean_std([m["rounds"] for m in ms]),
               "candidates_evaluated": mean_std([m["candidates_evaluated"] for m in ms]),
               "wall_s": mean_std([m["wall_s"] for m in ms]),
               "integrated_runs": sum(bool(m["integrated"]) for m in ms),
               "tokens": {r: {k: mean_std([m["tokens"].get(r, {}).get(k, 0) for m in ms])
                              for k in ("prompt", "completion")} for r in roles},
               "model_calls": {r: mean_std([m["model_calls"].get(r, 0) for m in ms])
                               for r in sorted({r for m in ms for r in m["model_calls"]})}}
        seed_tasks = ms[0]["seed_test_tasks"]
        tasks = [t for t in seed_tasks if all(t in m["final_test_tasks"] for m in ms)]
        intervals = {}
        if tasks:
            diff = {t: statistics.fmean(m["final_test_tasks"][t] for m in ms) - seed_tasks[t] for t in tasks}
            intervals["overall"] = bootstrap_interval(list(diff.values()))
            for c in CAPABILITIES:
                d = [x for t, x in diff.items() if labels.get(t) == c]
                if d:
                    intervals[c] = bootstrap_interval(d)
        agg["intervals"] = intervals
        out[v] = agg
    return out


def _ms(x: dict | None, digits: int = 3) -> str:
    return "-" if not x else f"{x['mean']:.{digits}f} ± {x['std']:.{digits}f}"


def _iv(x: dict | None) -> str:
    return "-" if not x else f"{x['gain']:+.3f} [{x['lo']:+.3f}, {x['hi']:+.3f}]" + (" *" if x["outside"] else "")


def render_markdown(exp, data: dict) -> str:
    cfg = exp.cfg
    agg, caps = data["aggregate"], data["capabilities"]
    out = [f"# memgym evolve experiment: {cfg.dataset}", "",
           f"- variants {', '.join(exp.variants)}; seeds {', '.join(map(str, exp.seeds))}; proposer `{cfg.proposer}`; "
           f"rounds cold {cfg.rounds_cold} / refine {cfg.rounds_refine} / integrate {cfg.rounds_integrate} "
           "(holistic: all of them as holistic rounds)",
           f"- train {', '.join(cfg.train)}; valid {', '.join(cfg.valid)}; test {', '.join(cfg.test) or '(none)'}; "
           f"extractor `{cfg.extractor}`, plan `{cfg.plan_mode}`, scorer `{cfg.scorer}`, delta {cfg.delta:g}",
           f"- finished runs: {data['finished_runs']} of {data['planned_runs']}; experiment wall time "
           f"{data['wall_s']:.0f} s", ""]
    for split in ("test", "valid"):
        out += [f"## Final program on {split} (mean ± std over seeds)", "",
                "| program | overall | " + " | ".join(f"{c} {CAPABILITY_NAMES[c]}" for c in caps) + " |",
                "|" + "---|" * (2 + len(caps))]
        for name, b in data["baselines"].items():  # the seed, then the recipe's static baselines
            s = b.get(split)
            if s:
                label = "seed program" if name == "seed" else f"baseline {name}"
                out.append(f"| {label} | " + f"{s['overall']:.3f} | " + " | ".join(
                    f"{s['by_capability'][c]:.3f}" if c in s["by_capability"] else "-" for c in caps) + " |")
        for v, a in agg.items():
            sc = a[split]
            if sc:
                out.append(f"| {v} | {_ms(sc['overall'])} | " + " | ".join(_ms(sc["by_capability"].get(c))
                                                                          for c in caps) + " |")
        if split == "test":
            for v, a in agg.items():
                if a["router_test"]:
                    r = a["router_test"]
                    out.append(f"| oracle-label router over {v}'s specialists (upper-bound reference) | "
                               f"{_ms(r['overall'])} | " + " | ".join(_ms(r["by_capability"].get(c)) for c in caps)
                               + " |")
        out.append("")
    out += ["## (final − seed) on test, paired bootstrap 90% interval over tasks", "",
            "Seed-averaged final score minus the seed program's, per task; `*` = the interval excludes 0.", "",
            "| variant | overall | " + " | ".join(caps) + " |", "|" + "---|" * (2 + len(caps))]
    outside = []
    for v, a in agg.items():
        iv = a["intervals"]
        out.append(f"| {v} | {_iv(iv.get('overall'))} | " + " | ".join(_iv(iv.get(c)) for c in caps) + " |")
        outside += [f"{v} {k}" for k, x in iv.items() if x and x["outside"]]
    out += ["", "Gains outside their interval: " + (", ".join(outside) if outside else "none") + ".", "",
            "## Cost per run (mean ± std over seeds)", "",
            "| variant | rounds | candidates evaluated | integrated runs | wall s | model calls per role | "
            "tokens per role (prompt + completion) |", "|---|---|---|---|---|---|---|"]
    for v, a in agg.items():
        calls = ", ".join(f"{r} {x['mean']:.0f}" for r, x in a["model_calls"].items()) or "-"
        toks = ", ".join(f"{r} {t['prompt']['mean'] + t['completion']['mean']:.0f}" for r, t in a["tokens"].items()) \
            or "0"
        out.append(f"| {v} | {_ms(a['rounds'], 1)} | {_ms(a['candidates_evaluated'], 1)} | {a['integrated_runs']}/"
                   f"{a['seeds']} | {_ms(a['wall_s'], 0)} | {calls} | {toks} |")
    out += ["", "## Performance boundary (valid, PrisMem Fig. 3b): `boundary.png`", "",
            "| variant | " + " | ".join(f"best {c} at any round" for c in caps) + " |", "|" + "---|" * (1 + len(caps))]
    for v, a in agg.items():
        out.append(f"| {v} | " + " | ".join(_ms(a["best_valid"].get(c)) for c in caps) + " |")
    out += ["", "Run directories: `<variant>/seed<k>/` (report.md, summary.json, best.py each)."]
    return "\n".join(out) + "\n"


def plot_boundary(data: dict, path: Path) -> bool:
    """boundary.png: per capability, the best valid score at any round of capability-driven
    (``full``) and holistic evolution, and the full method's final program (bars: mean over
    seeds, whiskers: std). Returns False when neither variant finished."""
    agg, caps = data["aggregate"], data["capabilities"]
    series = []
    if "full" in agg:
        series.append(("capability-driven: best at any round", agg["full"]["best_valid"]))
    if "holistic" in agg:
        series.append(("holistic: best at any round", agg["holistic"]["best_valid"]))
    if "full" in agg and agg["full"]["valid"]:
        series.append(("capability-driven: final program", agg["full"]["valid"]["by_capability"]))
    if not series:
        return False
    capability_bars(path, caps, [(name, [vals[c]["mean"] if vals.get(c) else 0.0 for c in caps],
                                  [vals[c]["std"] if vals.get(c) else 0.0 for c in caps]) for name, vals in series],
                    "Performance boundary per capability (valid, mean over seeds; whiskers: std)",
                    figsize=(7.5, 4.2), ylim=1.18, yticks=[0, 0.2, 0.4, 0.6, 0.8, 1.0], legend_size=7.5)
    return True


def write_experiment(exp) -> dict:
    """Collect every finished run of ``exp``, write experiment.json / experiment.md /
    boundary.png, return the experiment.json dict."""
    labels = test_labels(exp.cfg)
    runs: dict[str, dict[str, dict]] = {v: {} for v in exp.variants}
    for v in exp.variants:
        for s in exp.seeds:
            d = exp.run_dir(v, s)
            if (d / "summary.json").exists():
                runs[v][str(s)] = run_metrics(d, labels)
    finished = [m for seeds in runs.values() for m in seeds.values()]
    seed_base = {"valid": finished[0]["seed_valid"], "test": finished[0]["seed_test"]} if finished else {}
    caps = [c for c in CAPABILITIES if any(c in (m["valid"] or {}).get("by_capability", {}) for m in finished)]
    st = read_json(exp.root / "experiment_state.json", {})
    data = {"recipe": exp.cfg.__dict__, "variants": exp.variants, "seeds": exp.seeds, "capabilities": caps,
            "planned_runs": len(exp.variants) * len(exp.seeds), "finished_runs": len(finished),
            "wall_s": st.get("wall_s", 0.0),
            "baselines": {"seed": seed_base, **(finished[0]["static_baselines"] if finished else {})},
            "aggregate": aggregate(runs, labels),
            "runs": {v: {s: {k: x for k, x in m.items() if not k.endswith("_tasks")} for s, m in seeds.items()}
                     for v, seeds in runs.items()}}
    atomic_write_json(exp.root / "experiment.json", data)
    atomic_write_text(exp.root / "experiment.md", render_markdown(exp, data))
    plot_boundary(data, exp.root / "boundary.png")
    return data
