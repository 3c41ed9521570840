"""``memgym eval --config R.yaml [--extractor SPEC] [--out DIR] [--<field> value ...]`` (``--recipe``
is an alias of ``--config``)."""
from __future__ import annotations

import sys

from launch.passthrough import add_recipe_command

PROG = "memgym eval"


def run(argv: list[str]) -> int:
    """Parse the recipe (:class:`rewards.evaluate.EvalConfig`), run it, print the tables.
    Returns 0, or 2 for a bad recipe, field or data file (the message names it)."""
    from rewards.evaluate import EvalConfig, run_eval
    from rewards.report import side_by_side
    from training.common import parse_training_args

    try:
        (cfg,) = parse_training_args([EvalConfig], argv, PROG, (EvalConfig.__doc__ or "").strip() + " Use --config "
                                     "R.yaml for a recipe; any field below overrides it.", cpu_defaults=False)
    except (ValueError, FileNotFoundError) as e:
        print(f"{PROG}: {e}", file=sys.stderr)
        return 2
    report = run_eval(cfg)
    print(f"\nScore by category ({report['scorer']}); rows = LoCoMo categories, columns = extractors\n")
    print(side_by_side(report, "by_category"))
    print()
    print(side_by_side(report, "by_capability"))
    print(f"\nreport: {cfg.out}/report.md  (wall {report['wall_s']:.0f} s)")
    return 0


def register(sub) -> None:
    add_recipe_command(sub, "eval", help="build memory, answer QA from it, score, report (the main job)",
                       description="memgym eval --config R.yaml [--extractor SPEC] [--out DIR] (--help lists "
                                   "every recipe field)", run=run)
