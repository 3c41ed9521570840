"""``memgym eval --recipe R.yaml [--extractor SPEC] [--out DIR] [--<field> value ...]``."""
from __future__ import annotations

import argparse
import sys


def translate_recipe_args(argv: list[str]) -> list[str]:
    """``--recipe R`` → TrlParser's ``--config R`` (the rest are dataclass field overrides).
    Raises :class:`llm.config.ConfigError` when ``--recipe``/``--config`` has no value."""
    from llm.config import ConfigError

    out = list(argv)
    for i, a in enumerate(out):
        if a in ("--recipe", "--config") and (i + 1 == len(out) or out[i + 1].startswith("--")):
            raise ConfigError(f"{a} needs a value: the path of a YAML recipe ({a} R.yaml)")
        if a == "--recipe":
            out[i] = "--config"
        elif a.startswith("--recipe="):
            out[i] = "--config=" + a.split("=", 1)[1]
    if any(a.startswith("--config=") for a in out):
        i = next(i for i, a in enumerate(out) if a.startswith("--config="))
        out[i: i + 1] = ["--config", out[i].split("=", 1)[1]]
    return out


def parse_config(argv: list[str], cls, prog: str):
    from trl import TrlParser

    parser = TrlParser(dataclass_types=[cls], prog=prog,
                       description=(cls.__doc__ or "").strip() + " Use --recipe R.yaml for a recipe; any "
                                   "field below overrides it.")
    return parser.parse_args_and_config(args=translate_recipe_args(argv))[0]


def _run(args) -> int:
    from rewards.evaluate import EvalConfig, run_eval
    from rewards.report import side_by_side

    try:
        cfg = parse_config(args.rest, EvalConfig, "memgym eval")
    except (ValueError, FileNotFoundError) as e:
        print(f"memgym eval: {e}", file=sys.stderr)
        return 2
    report = run_eval(cfg)
    print(f"\nScore by category ({report['scorer']}); rows = LoCoMo categories, columns = extractors\n")
    print(side_by_side(report, "by_category"))
    print()
    print(side_by_side(report, "by_capability"))
    print(f"\nreport: {cfg.out}/report.md  (wall {report['wall_s']:.0f} s)")
    return report_problems("memgym eval", [report, *report.get("compare", {}).values()])


def report_problems(prog: str, reports: list[dict]) -> int:
    """Say on stderr what scored 0 without being a wrong answer (unparsable judge replies,
    empty answers, truncated manager outputs), and return 1 when a run had no question to
    score (an empty run is not a result), else 0."""
    rc = 0
    for r in reports:
        name = r.get("extractor") or r.get("program") or "?"
        if not r.get("n"):
            print(f"{prog}: {name}: 0 questions were scored (check --conversations, --n_sessions and "
                  "--max_questions); the 0.000 above is not a result", file=sys.stderr)
            rc = 1
        issues = [f"{r[k]} {what}" for k, what in (("judge_unparsable", "judge replies were not a CORRECT/WRONG "
                                                                         "verdict (scored 0)"),
                                                    ("empty_answers", "answers were empty (scored 0)")) if r.get(k)]
        truncated = (r.get("format_failures_by_type") or {}).get("truncated")
        if r.get("empty_sessions"):
            issues.append(f"{len(r['empty_sessions'])} sessions had no turns and were skipped "
                          f"({', '.join(r['empty_sessions'][:3])})")
        if truncated:
            issues.append(f"{truncated} manager outputs were cut off by the token limit (raise "
                          "extractor_max_new_tokens)")
        if issues:
            print(f"{prog}: {name}: warning: {'; '.join(issues)}", file=sys.stderr)
    return rc


def register(sub) -> None:
    p = sub.add_parser("eval", help="build memory, answer QA from it, score, report (the main job)",
                       add_help=False, description="memgym eval --recipe R.yaml [--extractor SPEC] [--out DIR]")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_run, passthrough=("eval",))
