"""``memgym program ...``: memory-program commands.

- ``memgym program check FILE.py [--parent P.py] [--no-probe] [--stats] [--timeout S]``
  runs the four validation levels (``memgym.evolution.execution.validate``) in the sandbox and prints ONE JSON
  line ``{"ok": bool, "level": 1-4 or null, "reason": str}`` (plus ``"stats"`` with
  ``--stats``) on stdout. Exit status 0 when the program passes, 1 when it fails a level (or
  the check itself broke; one stderr line says which level and why), 2 when FILE (or the
  parent) cannot be read; never a traceback, whatever the candidate does.

- ``memgym program eval FILE.py --config R.yaml [--extractor SPEC] [--parent PARENT.py]
  [--out DIR] [--<field> value ...]`` evaluates a program (``memgym.evolution.evaluation.program_eval``): writes
  ``report.json`` (overall, by_capability, by_category, diagnostics, stages_run/reused,
  model_calls, tokens, wall_s), ``report.md``, ``tasks.jsonl`` and ``units.jsonl``, and prints
  the capability table. Exit 0 on success, 1 when the program fails validation or breaks
  mid-run or no question was scored, 2 for a bad recipe, a missing file, or an ``--out`` folder
  holding anything but a previous program eval's files (raised, mapped by
  :func:`memgym.launch.cli.run_command`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from memgym.launch.registry import add_recipe_command


def _emit(payload: dict) -> None:
    print(json.dumps(payload, ensure_ascii=False))


def _read(path: str) -> str:
    return Path(path).read_text(encoding="utf-8")


def cmd_check(args: argparse.Namespace) -> int:
    """Validate one program file; print the verdict as JSON; a program that fails raises
    :class:`~memgym.evolution.execution.results.ProgramRunError` (exit 1), an unreadable file
    :class:`~memgym.llm.errors.ConfigError` (exit 2), after the verdict is printed."""
    from memgym.evolution.execution.results import ProgramRunError
    from memgym.llm.errors import ConfigError

    texts = {}
    for key, path in (("source", args.file), ("parent", args.parent)):
        if path is None:
            texts[key] = None
            continue
        try:
            texts[key] = _read(path)
        except (OSError, UnicodeDecodeError) as e:
            reason = f"cannot read {path}: {type(e).__name__}: {e}"
            _emit({"ok": False, "level": None, "reason": reason})
            raise ConfigError(reason) from None
    source, parent = texts["source"], texts["parent"]
    try:
        from memgym.evolution.execution.validate import ValidationLimits, validate_program

        limits = ValidationLimits(run_probe=not args.no_probe)
        if args.timeout is not None:
            limits = dataclasses.replace(limits, sandbox=dataclasses.replace(
                limits.sandbox, call_timeout_s=args.timeout, load_timeout_s=args.timeout))
        verdict = validate_program(source, parent, limits, progress=sys.stderr.isatty()).to_dict(with_stats=args.stats)
    except Exception as e:  # noqa: BLE001 - the contract is "never a traceback"
        verdict = {"ok": False, "level": None, "reason": f"internal error: {type(e).__name__}: {e}"}
    _emit(verdict)
    if not verdict["ok"]:
        where = f"level {verdict['level']}" if verdict["level"] is not None else "the check"
        raise ProgramRunError(f"{args.file} fails validation at {where}: {verdict['reason']}", stage="validate")
    return 0


#: What ``memgym program eval`` writes in ``--out``; a folder holding anything else is refused.
EVAL_FILES = ("report.json", "report.md", "tasks.jsonl", "units.jsonl")


def cmd_eval(args) -> int:
    """Evaluate one program file; print the capability table; write the reports."""
    from memgym.evolution.evaluation.program_eval import run_program_eval
    from memgym.evolution.execution.runner import ProgramRunError
    from memgym.llm.checks import out_dir_problem
    from memgym.llm.errors import OutputPathError
    from memgym.llm.recipe import recipe_configs

    if args.file:
        args.program = args.file
    (cfg,) = recipe_configs(args)
    problem = out_dir_problem(cfg.out, what="memgym program eval output", own=EVAL_FILES, mark=EVAL_FILES[0],
                              writes=f"memgym program eval writes {', '.join(EVAL_FILES)} there")
    if problem:
        raise OutputPathError(problem)
    rep = run_program_eval(cfg)
    if not rep.ok:
        v = rep.validation
        raise ProgramRunError(f"validation failed at level {v['level']}: {v['reason']}", stage="validate")
    rep = rep.to_dict()
    _print_summary(rep, cfg.out)
    return _report_problems(rep)


def _report_problems(rep: dict) -> int:
    """Failures that would otherwise hide in report.json: say them on stderr; exit 1 when no
    question was scored or every retrieve call failed (the scores then mean nothing)."""
    from memgym.launch.cmd_eval import report_problems

    rc = report_problems("memgym program eval", [rep])
    n, errors = rep.get("n", 0), rep.get("retrieve_errors", 0)
    if n and errors == n:
        first = next((t["error"] for t in rep.get("tasks", []) if t.get("error")), "")
        print(f"memgym program eval: every Memory.retrieve call failed ({errors} of {n}), e.g. {first[:200]}; "
              "the scores are not a result", file=sys.stderr)
        rc = 1
    elif errors:
        print(f"memgym program eval: warning: {errors} of {n} Memory.retrieve calls failed (scored 0)", file=sys.stderr)
    return rc


def _print_summary(rep: dict, out: str) -> None:
    diag = rep.get("diagnostics") or {}
    dcap = diag.get("by_capability", {})

    def f(v):
        return "-" if v is None else f"{v:.3f}"

    proto = f" ({rep.get('judge_protocol', 'official')} protocol)" if rep["config"]["scorer"] == "llm" else ""
    print(f"\n{rep['program']}: overall {rep['config']['scorer']}{proto} {rep['overall']:.3f} over {rep['n']} "
          "questions\n")
    print("| capability | n | score | d_ext | d_idx | d_ret |\n|---|---|---|---|---|---|")
    for k, v in rep["by_capability"].items():
        d = dcap.get(k, {})
        print(f"| {k} | {v['n']} | {v['score']:.3f} | {f(d.get('d_ext'))} | {f(d.get('d_idx'))} | {f(d.get('d_ret'))} |")
    if diag:
        o = diag["overall"]
        print(f"| overall | {rep['n']} | {rep['overall']:.3f} | {f(o['d_ext'])} | {f(o['d_idx'])} | {f(o['d_ret'])} |")
    print(f"\nstages run: {', '.join(rep['stages_run']) or '-'}; reused: {', '.join(rep['stages_reused']) or '-'}; "
          f"model calls: {json.dumps(rep['model_calls'])}")
    print(f"report: {out}/report.md  (wall {rep['wall_s']:.0f} s)")


def _positive(text: str) -> float:
    v = float(text)
    if not v > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return v


def register(subparsers) -> argparse.ArgumentParser:
    """Add the ``program`` command group (with its own sub-subcommands) to ``subparsers``."""
    p = subparsers.add_parser(
        "program", help="memory programs: validate (check) and evaluate (eval) candidates",
        description="Commands for PrisMem-style memory programs (one Python module defining MemoryUnit, Query, "
                    "Memory and the three instruction strings).")
    sub = p.add_subparsers(dest="program_command", metavar="SUBCOMMAND")
    sub.required = True
    c = sub.add_parser(
        "check", help="run the 4 validation levels on a program file and print a JSON verdict",
        description="Validate a memory program in the sandbox: (1) source parses, allowed imports only, loads and "
                    "defines the required names, differs from --parent; (2) schemas and signatures; (3) smoke tests "
                    "on a stub backend, retrieve within 16,000 characters; (4) a ~2K-unit complexity probe. Prints "
                    '{"ok": bool, "level": 1-4|null, "reason": str}. Exit 0 when it passes, 1 when it fails, 2 if FILE '
                    'is unreadable.')
    c.add_argument("file", metavar="FILE.py", help="the memory program to check")
    c.add_argument("--parent", metavar="PARENT.py", help="the program FILE was patched from (a no-op patch fails level 1)")
    c.add_argument("--no_probe", "--no-probe", action="store_true", help="skip level 4 (the complexity probe)")
    c.add_argument("--stats", action="store_true", help="add timing and toolkit-call statistics to the JSON")
    c.add_argument("--timeout", type=_positive, metavar="S",
                   help="wall seconds allowed for loading and for each call (default 20)")
    c.set_defaults(func=cmd_check)
    add_recipe_command(sub, "eval", make_eval_parser, help=EVAL_HELP)
    return p


EVAL_HELP = "evaluate a program on a benchmark: scores, diagnostics, stage reuse, cost"


def make_eval_parser(prog: str):
    """The recipe parser of ``memgym program eval``
    (:class:`memgym.evolution.evaluation.program_eval.ProgramEvalConfig`)."""
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig
    from memgym.llm.recipe import RecipeParser

    p = RecipeParser(
        [ProgramEvalConfig], prog=prog,
        description="Evaluate a memory program: extract -> index -> plan -> retrieve -> answer -> score with stage "
                    "caching, plus d_ext/d_idx/d_ret diagnostics. memgym program eval FILE.py --config R.yaml "
                    "[--<field> value ...]; every field below overrides the recipe.")
    p.add_argument("file", nargs="?", metavar="FILE.py", default=None, help="the memory program (= --program)")
    p.set_defaults(func=cmd_eval)
    return p
