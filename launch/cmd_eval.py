"""``memgym eval --recipe R.yaml [--extractor SPEC] [--out DIR] [--<field> value ...]``."""
from __future__ import annotations

import argparse
import sys


def translate_recipe_args(argv: list[str]) -> list[str]:
    """``--recipe R`` → TrlParser's ``--config R`` (the rest are dataclass field overrides)."""
    out = list(argv)
    for i, a in enumerate(out):
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
    print(f"\nScore by category ({report['scorer']}); rows = native categories, columns = extractors\n")
    print(side_by_side(report, "by_category"))
    print()
    print(side_by_side(report, "by_capability"))
    print(f"\nreport: {cfg.out}/report.md  (wall {report['wall_s']:.0f} s)")
    return 0


def register(sub) -> None:
    p = sub.add_parser("eval", help="build memory, answer QA from it, score, report (the main job)",
                       add_help=False, description="memgym eval --recipe R.yaml [--extractor SPEC] [--out DIR]")
    p.add_argument("rest", nargs=argparse.REMAINDER)
    p.set_defaults(func=_run, passthrough=("eval",))
