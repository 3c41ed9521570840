"""``memgym eval --config R.yaml [--extractor SPEC] [--out DIR] [--<field> value ...]`` (``--recipe``
is an alias of ``--config``)."""
from __future__ import annotations

import sys


PROG = "memgym eval"


def run(args) -> int:
    """Run the parsed recipe (:class:`memgym.evolution.evaluation.eval_job.EvalConfig`), print the tables.
    Returns 0, or 1 when a column scored no question; errors are raised (the message names the
    field or file) and mapped by :func:`memgym.launch.cli.run_command`."""
    from memgym.llm.recipe import recipe_configs
    from memgym.evolution.evaluation.eval_job import run_eval
    from memgym.rewards.scoring.report import format_failure_table, side_by_side

    (cfg,) = recipe_configs(args)
    report = run_eval(cfg)
    print(f"\nScore by category ({report['scorer']}, judge_protocol {report['judge_protocol']}); rows = native "
          "categories, columns = extractors\n")
    print(side_by_side(report, "by_category"))
    print()
    print(side_by_side(report, "by_capability"))
    print("\nFormat-failure rate per manager (outputs that failed to parse, validate or apply)\n")
    print(format_failure_table(report))
    print(f"\nreport: {cfg.out}/report.md  (wall {report['wall_s']:.0f} s)")
    return report_problems(PROG, [report, *report.get("compare", {}).values()])


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
        issues = [f"{r[k]} {what}" for k, what in (("judge_unparsable", "judge replies were unreadable by the "
                                                                         "protocol's rule (scored as it scores them, "
                                                                         "not cached)"),
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


HELP = "build memory, answer QA from it, score, report (the main job)"


def make_parser(prog: str):
    """The recipe parser of ``memgym eval``
    (:class:`memgym.evolution.evaluation.eval_job.EvalConfig`)."""
    from memgym.evolution.evaluation.eval_job import EvalConfig
    from memgym.llm.recipe import RecipeParser

    p = RecipeParser([EvalConfig], prog=prog, description=(EvalConfig.__doc__ or "").strip() + " memgym eval "
                     "--config R.yaml [--<field> value ...]; any field below overrides the recipe.")
    p.set_defaults(func=run)
    return p


def register(sub) -> None:
    """Add ``memgym eval`` (its parser built when chosen)."""
    from memgym.launch.registry import add_recipe_command

    add_recipe_command(sub, "eval", make_parser, help=HELP)
