"""The report renderer of every evaluation: score tables (one column per system), protocol
lines, and ``report.json``, ``report.md``, ``predictions.jsonl`` and a per-category PNG.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

from memgym.data_synth.capabilities import LOCOMO_CATEGORY_NAMES as CATEGORY_NAMES
from memgym.llm.runcard import card_markdown
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.schema import CAPABILITY_NAMES


def _runs(report: dict) -> list[tuple[str, dict]]:
    """(column label, column report) pairs: the main extractor first, then ``compare``. The
    label is the spec, plus " (constrained)" for a column decoded under its schemas."""
    return [(report.get("column", report["extractor"]), report)] + list(report.get("compare", {}).items())


def _label(key: str, names: dict) -> str:
    return f"{key} {names[key]}" if key in names else key


def _cell(v, digits: int = 3) -> str:
    if v is None:
        return "-"
    if isinstance(v, float) and math.isnan(v):
        return "NaN"
    return f"{v:.{digits}f}"


def side_by_side(report: dict, group: str = "by_category", columns: list[tuple[str, dict]] | None = None,
                 digits: int = 3) -> str:
    """A markdown table: one row per category (or capability), one score column per system
    (``columns`` = ``[(label, summary)]``, default the eval report's extractor columns), with
    ``n`` (questions judged). Scores are in [0, 1]."""
    runs = columns if columns is not None else _runs(report)
    names = CATEGORY_NAMES if group == "by_category" else CAPABILITY_NAMES
    keys = sorted({k for _, r in runs for k in r.get(group, {})})
    head = "| " + ("category" if group == "by_category" else "capability") + " | n | " + \
        " | ".join(spec for spec, _ in runs) + " |"
    lines = [head, "|" + "---|" * (2 + len(runs))]
    for k in keys:
        n = max(r[group].get(k, {}).get("n", 0) for _, r in runs)
        cells = [_cell(r[group][k]["score"], digits) if k in r[group] else "-" for _, r in runs]
        lines.append(f"| {_label(k, names)} | {n} | " + " | ".join(cells) + " |")
    lines.append(f"| **overall** | {runs[0][1].get('judged', runs[0][1]['n'])} | "
                 + " | ".join(f"**{_cell(r['overall'], digits)}**" for _, r in runs) + " |")
    return "\n".join(lines)


def headline_table(dataset: str | None, columns: list[tuple[str, dict]], digits: int = 3) -> list[str]:
    """Markdown lines of the benchmark's own numbers (:func:`memgym.rewards.scoring.summary.summarise`),
    one column per system.
    """
    head = "| | " + " | ".join(label for label, _ in columns) + " |"
    out = [head, "|---|" + "---|" * len(columns)]

    def row(name, key, fmt=lambda v: _cell(v, digits)):
        out.append(f"| {name} | " + " | ".join(fmt(r.get(key)) for _, r in columns) + " |")

    if dataset == "longmemeval":
        row("task-averaged accuracy", "task_averaged")
        row("overall accuracy", "overall")
        row("abstention accuracy", "abstention")
    elif dataset == "beam":
        abilities = list(dict.fromkeys(a for _, r in columns for a in r.get("by_ability", {})))
        for a in abilities:
            out.append(f"| {a} | " + " | ".join(_cell(r.get("by_ability", {}).get(a), digits) for _, r in columns)
                       + " |")
        row("**overall (memgym's: mean of the abilities)**", "overall")
    else:
        row("overall", "overall")
    row("judged questions", "judged", fmt=lambda v: "-" if v is None else str(v))
    row("missing predictions" + (" (counted as wrong)" if any(r.get("missing_as_wrong") for _, r in columns)
                                 else " (not counted)"), "missing", fmt=lambda v: str(len(v or [])))
    if any(r.get("undefined") for _, r in columns):
        row("undefined (NaN, left out of the means)", "undefined", fmt=lambda v: str(v or 0))
    return out


#: Scorers that are memgym's offline proxies, not a benchmark's metric (docs/design.md § Judges and scoring).
OFFLINE_PROXIES = ("grounded-recall", "answer-recall", "rubric-recall")


def protocol_lines(rep: dict) -> list[str]:
    """Report lines naming the scorer and the judge protocol behind the numbers."""
    line = f"- scorer: `{rep.get('scorer')}`, judge_protocol: `{rep.get('judge_protocol', 'official')}`"
    if rep.get("judge_note"):
        line += f" ({rep['judge_note']})"
    if rep.get("scorer") in OFFLINE_PROXIES:
        line += (" — an offline proxy of memgym's (no judge call), not the benchmark's own number; "
                 "judge_protocol applies to the LLM judges only")
    out = [line]
    from memgym.rewards.scoring.scorers import BLIND_SPOTS
    if rep.get("scorer") in BLIND_SPOTS:
        out.append(f"- what `{rep['scorer']}` cannot see: {BLIND_SPOTS[rep['scorer']]}")
    elif rep.get("scorer") == "grounded-recall":
        out.append("- grounded-recall: half the gold evidence turns held verbatim (runs of 4 normalised tokens), half "
                   "the answer's (BEAM: rubric items') words inside conversation text; questions without gold "
                   "evidence are undefined (NaN, left out of the means)")
    jc = rep.get("judge_calls")
    if jc:
        out.append(f"- judge calls: {jc['prompts']} requests, no retries (the official protocols retry none); "
                   f"{jc['unreadable']} replies unreadable by the protocol's rule (scored as it scores them, "
                   f"never cached)")
    return out


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
    ds = report.get("dataset", cfg.get("dataset"))
    out = [f"# memgym eval: {', '.join(cfg.get('conversations', []))}", "",
           f"- dataset: {ds}, sessions: {cfg.get('n_sessions') or 'all'}, "
           f"answer model: `{report['answer_model']}`, program: `{cfg.get('program', '-')}`",
           *protocol_lines(report),
           f"- wall time: {report['wall_s']:.1f} s", "",
           f"## {ds} headline ({report['scorer']}, {report.get('judge_protocol', 'official')})", "",
           *headline_table(ds, runs), "",
           f"## Score by category ({report['scorer']})", "", side_by_side(report, "by_category"), "",
           "## Score by capability", "", side_by_side(report, "by_capability"), "",
           "## Answer recall of the retrieved context", "",
           "| extractor | recall |", "|---|---|"]
    out += [f"| {spec} | {r['overall_recall']:.3f} |" for spec, r in runs]
    if any(r.get("judge_calls") for _, r in runs):
        out += ["", "## Judge calls", "", "| extractor | requests | retries | unreadable replies |", "|---|---|---|---|"]
        out += [f"| {spec} | {r['judge_calls']['prompts']} | 0 | {r['judge_calls']['unreadable']} |"
                for spec, r in runs if r.get("judge_calls")]
    if any(r.get("segments") for _, r in runs):
        out += ["", "## Memory construction steps (sessions beyond the extractor's context are built in segments)", "",
                "| extractor | conversation | sessions | segments | sessions split |", "|---|---|---|---|---|"]
        out += [f"| {spec} | {c} | {v['sessions']} | {v['segments']} | {len(v['split_sessions'])} |"
                for spec, r in runs for c, v in (r.get("segments") or {}).items()]
    out += ["", "## Format-failure rate per manager", "",
            "Columns marked (constrained) decode every manager output under its JSON schema.", "",
            format_failure_table(report)]
    out += ["", "## Failures that score 0", "",
            "| extractor | format failures by type | empty answers | unreadable judge replies |", "|---|---|---|---|"]
    out += [f"| {spec} | {json.dumps(r.get('format_failures_by_type', {}))} | {r.get('empty_answers', 0)} | "
            f"{r.get('judge_unparsable', 0)} |" for spec, r in runs]
    out += ["", "## Model calls", "", "| extractor | calls per role | tokens per role | wall s |", "|---|---|---|---|"]
    out += [f"| {spec} | {json.dumps(r['model_calls'])} | {json.dumps(r['tokens'])} | {r['wall_s']:.1f} |"
            for spec, r in runs]
    return "\n".join(out) + "\n"


def pyplot():
    """``matplotlib.pyplot`` on the Agg backend (every report figure is drawn through it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def save_figure(fig, path, dpi: int = 120) -> None:
    """Lay out, write and close ``fig``."""
    fig.tight_layout()
    fig.savefig(path, dpi=dpi)
    pyplot().close(fig)


def plot_categories(report: dict, path: Path) -> None:
    """Grouped bar chart of the per-category score of every extractor (PNG)."""
    import numpy as np

    runs = _runs(report)
    keys = sorted({k for _, r in runs for k in r["by_category"]})
    if not keys:
        return
    x = np.arange(len(keys))
    w = 0.8 / len(runs)
    fig, ax = pyplot().subplots(figsize=(max(5, 1.4 * len(keys)), 3.5))
    for i, (spec, r) in enumerate(runs):
        ax.bar(x + i * w, [r["by_category"].get(k, {}).get("score", 0.0) for k in keys], w, label=spec)
    ax.set_xticks(x + w * (len(runs) - 1) / 2, [_label(k, CATEGORY_NAMES) for k in keys], fontsize=8)
    ax.set_ylabel(f"{report['scorer']} ({report.get('judge_protocol', 'official')})")
    ax.set_ylim(0, 1)
    ax.legend(fontsize=7)
    save_figure(fig, path)


def write_eval_report(report: dict, out: Path) -> None:
    """Write ``report.json`` (predictions moved to ``predictions.jsonl``), ``report.md`` (with the
    run card's section when the report has ``run_card``) and ``by_category.png`` under ``out``."""
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
    card = card_markdown(report.get("run_card"), str(out / "report.json"))
    (out / "report.md").write_text(render_markdown(report) + "\n".join(["", *card]), encoding="utf-8")
    plot_categories(report, out / "by_category.png")
