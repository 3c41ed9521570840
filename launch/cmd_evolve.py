"""``memgym evolve``: capability-driven evolution of a memory program (PrisMem).

- ``memgym evolve --config R.yaml [--out DIR] [--<field> value ...]`` starts a run in DIR
  (the recipe and seed program are stored there);
- ``memgym evolve --resume DIR`` continues the run in DIR with the recipe stored there; a
  resumed run ends in the same state as an uninterrupted one;
- ``memgym evolve experiment --config R.yaml --variants full,holistic,... --seeds 3 [--out DIR]``
  runs every ablation variant with every seed (:mod:`evolution.search.experiment`);
  ``memgym evolve experiment --resume DIR`` continues one without re-running finished runs.

Writes DIR/report.md, capabilities.png, summary.json and best.py (see
:mod:`evolution.search.report`). Exit 0 on success (also when a budget stopped the run
early: the report says so), 2 for a bad recipe, a missing file, a damaged run state, a
recipe.json that no longer matches the stored run, a DIR that already holds a run or other
files, or a DIR another process is working in; 1 when the seed program itself cannot run or
the coder's endpoint failed 3 rounds in a row (state saved: ``--resume`` continues). A fresh
start that fails leaves nothing behind in DIR.
"""
from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from launch.errors import say_error
from launch.passthrough import add_recipe_command


def _config_from_dir(run_dir: str):
    from evolution.search.config import EvolveConfig

    path = Path(run_dir) / "recipe.json"
    if not path.is_file():
        raise FileNotFoundError(f"no run to resume in {run_dir}: {path} is missing")
    from evolution.search.rundir import RunStateError, read_json

    d = read_json(path)
    if not isinstance(d, dict):
        raise RunStateError(f"{path}: damaged recipe: a JSON object expected, got {type(d).__name__}")
    cfg = EvolveConfig.from_record(d)
    cfg.out = str(run_dir)
    return cfg


def _take(rest: list[str], flag: str) -> str | None:
    """Remove ``flag VALUE`` (or ``flag=VALUE``) from ``rest``; the value, None when absent;
    ValueError when the value is missing."""
    for i, a in enumerate(rest):
        if a == flag:
            if i + 1 >= len(rest):
                raise ValueError(f"{flag} needs a value")
            v = rest[i + 1]
            del rest[i: i + 2]
            return v
        if a.startswith(flag + "="):
            del rest[i]
            return a.split("=", 1)[1]
    return None


def cmd_experiment(argv: list[str]) -> int:
    """``memgym evolve experiment`` (see :mod:`evolution.search.experiment`)."""
    from evolution.execution.runner import ProgramRunError
    from evolution.search.config import EvolveConfig
    from evolution.search.experiment import VARIANTS, Experiment
    from llm.recipes import parse_recipe

    rest = list(argv)
    try:
        resume = _take(rest, "--resume")
        variants = _take(rest, "--variants")
        seeds = _take(rest, "--seeds")
        if resume is not None:
            if rest or variants or seeds:
                raise ValueError(f"--resume takes no other arguments (the recipe is stored in {resume})")
            exp = Experiment.from_dir(resume)
        else:
            (cfg,) = parse_recipe(
                [EvolveConfig], rest, "memgym evolve experiment",
                "Every ablation variant x every seed under one recipe (PrisMem Table 4): memgym evolve experiment "
                f"--config R.yaml --variants {','.join(VARIANTS)} --seeds 3 [--out DIR] [--<field> value ...]; "
                "memgym evolve experiment --resume DIR continues one. Writes DIR/experiment.md, experiment.json, "
                "boundary.png.", cpu_defaults=False)
            if seeds is not None and not seeds.isdigit():
                raise ValueError(f"--seeds must be a positive integer, got {seeds!r}")
            exp = Experiment(cfg, variants or ",".join(VARIANTS), int(seeds or 3))
        data = exp.run(resume=resume is not None)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        say_error("memgym evolve experiment", e)
        return 2
    except ProgramRunError as e:
        say_error("memgym evolve experiment", f"a program could not run: {e}")
        return 1
    print((exp.root / "experiment.md").read_text(encoding="utf-8"))
    print(f"{data['finished_runs']} runs; report: {exp.root}/experiment.md, boundary.png")
    return 0


def cmd_evolve(argv: list[str]) -> int:
    import sqlite3

    from evolution.execution.runner import ProgramRunError
    from evolution.search import api
    from evolution.search.config import EvolveConfig
    from evolution.search.stops import EndpointUnreachable
    from llm.base import LLMError
    from llm.recipes import parse_recipe

    rest = list(argv)
    if rest and rest[0] == "experiment":
        return cmd_experiment(rest[1:])
    resume = None
    if "--resume" in rest:
        i = rest.index("--resume")
        if i + 1 >= len(rest) or rest[i + 1].startswith("--"):
            print("memgym evolve: --resume needs the run directory: memgym evolve --resume DIR", file=sys.stderr)
            return 2
        resume = rest[i + 1]
        del rest[i: i + 2]
    try:
        if resume is not None:
            display = {"--no_progress": False, "--progress": True}  # display only: the run state is unchanged
            shown = [a for a in rest if a in display]
            rest = [a for a in rest if a not in display]
            if rest:
                print(f"memgym evolve: --resume takes no other arguments than --no_progress (the recipe is stored "
                      f"in {resume}); got {' '.join(rest)}", file=sys.stderr)
                return 2
            cfg = _config_from_dir(resume)
            if shown:
                cfg.progress = display[shown[-1]]
        else:
            (cfg,) = parse_recipe(
                [EvolveConfig], rest, "memgym evolve",
                "Capability-driven evolution of a memory program (PrisMem): cold start, capability refinement, "
                "trace-guided integration, frozen final program on the test split. memgym evolve --config R.yaml "
                "[--out DIR] [--<field> value ...]; memgym evolve --resume DIR continues a run; memgym evolve "
                "experiment --config R.yaml --variants ... --seeds N runs the ablations.", cpu_defaults=False,
                help_only=[("--resume", "DIR", "continue the run in DIR with the recipe stored there (no other "
                                               "arguments but --no_progress); a resumed run ends in the same "
                                               "state as an uninterrupted one")])
        result = api.evolve(cfg, resume=resume is not None)
    except (ValueError, FileNotFoundError, FileExistsError, sqlite3.Error, LLMError, OSError) as e:
        say_error("memgym evolve", e)
        return 2
    except ProgramRunError as e:
        say_error("memgym evolve", f"a program could not run: {e}")
        return 1
    except EndpointUnreachable as e:
        say_error("memgym evolve", e)
        return 1
    _print(result.summary, cfg.out)
    return 0


def _print(s: dict, out: str) -> None:
    """The per-capability (and, for BEAM / LongMemEval, per-ability) tables, valid then test:
    seed, each specialist, the frozen program (:func:`evolution.search.report.console_summary`)."""
    from evolution.search.report import console_summary
    print(console_summary(s, out))
    from evolution.execution.confine import current_label

    label = current_label()
    if not label.startswith("kernel:"):
        print(f"sandbox: {label}")


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``memgym evolve``."""
    return add_recipe_command(
        subparsers, "evolve", help="evolve a memory program (cold start, capability refinement, integration; "
                                   "resumable); `memgym evolve experiment` runs the ablations",
        description="memgym evolve --config R.yaml [--out DIR] [--<field> value ...] | memgym evolve --resume DIR "
                    "| memgym evolve experiment --config R.yaml --variants full,holistic,round_robin,random_cases,"
                    "no_integration --seeds 3 (--help lists every recipe field)", run=cmd_evolve)
