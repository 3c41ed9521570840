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
early: the report says so), 2 for a bad recipe, a missing file or a DIR that already holds
a run, 1 when the seed program itself cannot run.
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

from launch.passthrough import add_recipe_command


def _config_from_dir(run_dir: str):
    from evolution.search.config import EvolveConfig

    path = Path(run_dir) / "recipe.json"
    if not path.is_file():
        raise FileNotFoundError(f"no run to resume in {run_dir}: {path} is missing")
    d = json.loads(path.read_text(encoding="utf-8"))
    known = {f.name for f in dataclasses.fields(EvolveConfig)}
    cfg = EvolveConfig(**{k: v for k, v in d.items() if k in known})
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
    from training.common import parse_training_args

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
            (cfg,) = parse_training_args(
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
        print(f"memgym evolve experiment: {e}", file=sys.stderr)
        return 2
    except ProgramRunError as e:
        print(f"memgym evolve experiment: a program could not run: {e}", file=sys.stderr)
        return 1
    print((exp.root / "experiment.md").read_text(encoding="utf-8"))
    print(f"{data['finished_runs']} runs; report: {exp.root}/experiment.md, boundary.png")
    return 0


def cmd_evolve(argv: list[str]) -> int:
    from evolution.execution.runner import ProgramRunError
    from evolution.search.ablations import build_evolution
    from evolution.search.config import EvolveConfig
    from evolution.search.rundir import atomic_write_json
    from training.common import parse_training_args

    rest = list(argv)
    if rest and rest[0] == "experiment":
        return cmd_experiment(rest[1:])
    resume = cfg = None
    if "--resume" in rest:
        i = rest.index("--resume")
        if i + 1 >= len(rest):
            print("memgym evolve: --resume needs the run directory", file=sys.stderr)
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
            (cfg,) = parse_training_args(
                [EvolveConfig], rest, "memgym evolve",
                "Capability-driven evolution of a memory program (PrisMem): cold start, capability refinement, "
                "trace-guided integration, frozen final program on the test split. memgym evolve --config R.yaml "
                "[--out DIR] [--<field> value ...]; memgym evolve --resume DIR continues a run; memgym evolve "
                "experiment --config R.yaml --variants ... --seeds N runs the ablations.", cpu_defaults=False)
            out = Path(cfg.out)
            if (out / "state.json").exists() or (out / "recipe.json").exists():
                print(f"memgym evolve: {out} already holds a run; continue it with: memgym evolve --resume {out}",
                      file=sys.stderr)
                return 2
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out / "recipe.json", dataclasses.asdict(cfg))
        evo = build_evolution(cfg)
        summary = evo.run(resume=resume is not None)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        if resume is None and cfg is not None and not (Path(cfg.out) / "state.json").exists():
            # nothing ran: leave no half-made run behind that would block the corrected command
            (Path(cfg.out) / "recipe.json").unlink(missing_ok=True)
        print(f"memgym evolve: {e}", file=sys.stderr)
        return 2
    except ProgramRunError as e:
        print(f"memgym evolve: a program could not run: {e}", file=sys.stderr)
        return 1
    _print(summary, cfg.out)
    return 0


def _print(s: dict, out: str) -> None:
    """The per-capability (and, for BEAM / LongMemEval, per-ability) tables, valid then test:
    seed, each specialist, the frozen program (:func:`evolution.search.report.console_summary`)."""
    from evolution.search.report import console_summary
    print(console_summary(s, out))


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``memgym evolve``."""
    return add_recipe_command(
        subparsers, "evolve", help="evolve a memory program (cold start, capability refinement, integration; "
                                   "resumable); `memgym evolve experiment` runs the ablations",
        description="memgym evolve --config R.yaml [--out DIR] [--<field> value ...] | memgym evolve --resume DIR "
                    "| memgym evolve experiment --config R.yaml --variants full,holistic,round_robin,random_cases,"
                    "no_integration --seeds 3 (--help lists every recipe field)", run=cmd_evolve)
