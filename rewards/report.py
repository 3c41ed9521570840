"""Writing eval reports: ``report.json`` (machine-readable), ``report.md`` (tables, one
column per extractor), ``predictions.jsonl`` and a per-category PNG bar chart."""
from __future__ import annotations

import json
from pathlib import Path

from data_synth.capabilities import CAPABILITY_NAMES
from data_synth.capabilities import LOCOMO_CATEGORY_NAMES as CATEGORY_NAMES
from memory_bank.actions import MANAGERS


def _runs(report: dict) -> list[tuple[str, dict]]:
    """(column label, column report) pairs: the main extractor first, then ``compare``. The
    label is the spec, plus " (constrained)" for a column decoded under its schemas."""
    return [(report.get("column", report["extractor"]), report)] + list(report.get("compare", {}).items())


def _label(key: str, names: dict) -> str:
    return f"{key} {names[key]}" if key in names else key


def side_by_side(report: dict, group: str = "by_category") -> str:
    """A markdown table: one row per category (or capability), one score column per
    extractor, with ``n`` (questions). Scores are in [0, 1], shown to 3 decimals."""
    runs = _runs(report)
    names = CATEGORY_NAMES if group == "by_category" else CAPABILITY_NAMES
    keys = sorted({k for _, r in runs for k in r[group]})
    head = "| " + ("category" if group == "by_category" else "capability") + " | n | " + \
        " | ".join(spec for spec, _ in runs) + " |"
    lines = [head, "|" + "---|" * (2 + len(runs))]
    for k in keys:
        n = max(r[group].get(k, {}).get("n", 0) for _, r in runs)
        cells = [f"{r[group][k]['score']:.3f}" if k in r[group] else "-" for _, r in runs]
        lines.append(f"| {_label(k, names)} | {n} | " + " | ".join(cells) + " |")
    lines.append(f"| **overall** | {runs[0][1]['n']} | " + " | ".join(f"**{r['overall']:.3f}**" for _, r in runs) + " |")
    return "\n".join(lines)


def format_failure_table(report: dict) -> str:
    """A markdown table: one row per extractor column, the share of each manager's outputs
    that failed to parse, validate or apply (in [0, 1], 2 decimals)."""
    lines = ["| extractor | " + " | ".join(MANAGERS) + " |", "|---|" + "---|" * len(MANAGERS)]
    lines += [f"| {spec} | " + " | ".join(f"{r['format_failure_rate'][m]:.2f}" for m in MANAGERS) + " |"
              for spec, r in _runs(report)]
    return "\n".join(lines)


def render_markdown(report: dict) -> str:
    runs = _runs(report)
    cfg = report.get("config", {})
    out = [f"# memgym eval: {', '.join(cfg.get('conversations', []))}", "",
           f"- dataset: {cfg.get('dataset')}, sessions: {cfg.get('n_sessions') or 'all'}, "
           f"answer model: `{report['answer_model']}`, scorer: `{report['scorer']}`, top-k: {cfg.get('top_k')}",
           f"- wall time: {report['wall_s']:.1f} s", "",
           f"## Score by category ({report['scorer']})", "", side_by_side(report, "by_category"), "",
           "## Score by capability", "", side_by_side(report, "by_capability"), "",
           "## Answer recall of the retrieved context", "",
           "| extractor | recall |", "|---|---|"]
    out += [f"| {spec} | {r['overall_recall']:.3f} |" for spec, r in runs]
    head = report.get("headline") or {}
    if "by_ability" in head:
        out += ["", f"## BEAM abilities ({report['scorer']}; mean per chat, then over chats)", "",
                "| ability | " + " | ".join(spec for spec, _ in runs) + " |", "|---|" + "---|" * len(runs)]
        for a in head["by_ability"]:
            out.append(f"| {a} | " + " | ".join(f"{r.get('headline', {}).get('by_ability', {}).get(a, 0.0):.3f}"
                                                for _, r in runs) + " |")
        out.append("| **overall (ours)** | " + " | ".join(f"**{r['headline']['overall']:.3f}**" for _, r in runs) + " |")
        out += ["", f"_{head['note']}_"]
    if "task_averaged_accuracy" in head:
        out += ["", "## LongMemEval headline", "", "| extractor | task-averaged | overall | abstention |",
                "|---|---|---|---|"]
        for spec, r in runs:
            h = r["headline"]
            ab = "-" if h["abstention_accuracy"] is None else f"{h['abstention_accuracy']:.3f}"
            out.append(f"| {spec} | {h['task_averaged_accuracy']:.3f} | {h['overall_accuracy']:.3f} | {ab} |")
    if any(r.get("judge_calls") for _, r in runs):
        out += ["", "## Judge calls", "", "| extractor | prompts | retried | unparsable (scored 0) |", "|---|---|---|---|"]
        out += [f"| {spec} | {r['judge_calls']['prompts']} | {r['judge_calls']['retried']} | "
                f"{r['judge_calls']['unparsable']} |" for spec, r in runs if r.get("judge_calls")]
    if any(r.get("segments") for _, r in runs):
        out += ["", "## Memory construction steps (sessions beyond the extractor's context are built in segments)", "",
                "| extractor | conversation | sessions | segments | sessions split |", "|---|---|---|---|---|"]
        out += [f"| {spec} | {c} | {v['sessions']} | {v['segments']} | {len(v['split_sessions'])} |"
                for spec, r in runs for c, v in (r.get("segments") or {}).items()]
    out += ["", "## Format-failure rate per manager", "",
            "Columns marked (constrained) decode every manager output under its JSON schema.", "",
            format_failure_table(report)]
    out += ["", "## Failures that score 0", "",
            "| extractor | format failures by type | empty answers | unparsable judge replies |", "|---|---|---|---|"]
    out += [f"| {spec} | {json.dumps(r.get('format_failures_by_type', {}))} | {r.get('empty_answers', 0)} | "
            f"{r.get('judge_unparsable', 0)} |" for spec, r in runs]
    out += ["", "## Model calls", "", "| extractor | calls per role | tokens per role | wall s |", "|---|---|---|---|"]
    out += [f"| {spec} | {json.dumps(r['model_calls'])} | {json.dumps(r['tokens'])} | {r['wall_s']:.1f} |"
            for spec, r in runs]
    return "\n".join(out) + "\n"


def plot_categories(report: dict, path: Path) -> None:
    """Grouped bar chart of the per-category score of every extractor (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    runs = _runs(report)
    keys = sorted({k for _, r in runs for k in r["by_category"]})
    if not keys:
        return
    x = np.arange(len(keys))
    w = 0.8 / len(runs)
    fig, ax = plt.subplots(figsize=(max(5, 1.4 * len(keys)), 3.5))
    for i, (spec, r) in enumerate(runs):
        ax.bar(x + i * w, [r["by_category"].get(k, {}).get("score", 0.0) for k in keys], w, label=spec)
    ax.set_xticks(x + w * (len(runs) - 1) / 2, [_label(k, CATEGORY_NAMES) for k in keys], fontsize=8)
    ax.set_ylabel(report["scorer"])
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_eval_report(report: dict, out: Path) -> None:
    """Write ``report.json`` (predictions moved to ``predictions.jsonl``), ``report.md`` and
    ``by_category.png`` under ``out``."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "predictions.jsonl", "w", encoding="utf-8") as fh:
        for spec, r in _runs(report):
            for row in r.get("predictions", []):
                fh.write(json.dumps({"extractor": spec, **row}, ensure_ascii=False) + "\n")

    def strip(r):
        return {k: v for k, v in r.items() if k not in ("predictions", "compare")}

    slim = strip(report)
    slim["compare"] = {spec: strip(r) for spec, r in report.get("compare", {}).items()}
    (out / "report.json").write_text(json.dumps(slim, indent=2, ensure_ascii=False), encoding="utf-8")
    (out / "report.md").write_text(render_markdown(report), encoding="utf-8")
    plot_categories(report, out / "by_category.png")
