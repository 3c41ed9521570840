"""``memgym evolve``: capability-driven evolution of a memory program (PrisMem).

- ``memgym evolve --config R.yaml [--out DIR] [--<field> value ...]`` starts a run in DIR
  (the recipe and seed program are stored there);
- ``memgym evolve --resume DIR`` continues the run in DIR with the recipe stored there; a
  resumed run ends in the same state as an uninterrupted one.

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


def cmd_evolve(argv: list[str]) -> int:
    from evolution.execution.runner import ProgramRunError
    from evolution.search.config import EvolveConfig
    from evolution.search.loop import Evolution
    from evolution.search.rundir import atomic_write_json
    from training.common import parse_training_args

    rest = list(argv)
    resume = None
    if "--resume" in rest:
        i = rest.index("--resume")
        if i + 1 >= len(rest):
            print("memgym evolve: --resume needs the run directory", file=sys.stderr)
            return 2
        resume = rest[i + 1]
        del rest[i: i + 2]
    try:
        if resume is not None:
            if rest:
                print(f"memgym evolve: --resume takes no other arguments (the recipe is stored in {resume}); got "
                      f"{' '.join(rest)}", file=sys.stderr)
                return 2
            cfg = _config_from_dir(resume)
        else:
            (cfg,) = parse_training_args(
                [EvolveConfig], rest, "memgym evolve",
                "Capability-driven evolution of a memory program (PrisMem): cold start, capability refinement, "
                "frozen final program on the test split. memgym evolve --config R.yaml [--out DIR] "
                "[--<field> value ...]; memgym evolve --resume DIR continues a run.", cpu_defaults=False)
            out = Path(cfg.out)
            if (out / "state.json").exists() or (out / "recipe.json").exists():
                print(f"memgym evolve: {out} already holds a run; continue it with: memgym evolve --resume {out}",
                      file=sys.stderr)
                return 2
            out.mkdir(parents=True, exist_ok=True)
            atomic_write_json(out / "recipe.json", dataclasses.asdict(cfg))
        evo = Evolution(cfg)
        summary = evo.run(resume=resume is not None)
    except (ValueError, FileNotFoundError, FileExistsError) as e:
        print(f"memgym evolve: {e}", file=sys.stderr)
        return 2
    except ProgramRunError as e:
        print(f"memgym evolve: a program could not run: {e}", file=sys.stderr)
        return 1
    _print(summary, cfg.out)
    return 0


def _print(s: dict, out: str) -> None:
    def f(v):
        return "-" if v is None else f"{v:.3f}"

    print(f"\n{s['rounds']} rounds, {s['candidates_evaluated']} candidates evaluated, {s['proposals_failed']} "
          f"proposals not evaluated, {s['wall_s']:.0f} s" + (f"; stopped: {s['stopped']}" if s["stopped"] else ""))
    caps = list(s["seed"]["valid"]["by_capability"])
    print("| program | valid overall | " + " | ".join(caps) + " | test overall |")
    print("|---|---|" + "---|" * len(caps) + "---|")
    rows = [("seed", s["seed"]), (f"final ({s['final_id']})", s["final"])]
    rows += [(f"specialist {c} ({v['id']})", {"valid": v["valid"], "test": None}) for c, v in s["specialists"].items()]
    for name, r in rows:
        v = r["valid"]
        print(f"| {name} | {f(v['overall'])} | " + " | ".join(f(v["by_capability"].get(c)) for c in caps)
              + f" | {f(r['test']['overall']) if r.get('test') else '-'} |")
    print(f"report: {out}/report.md; frozen program: {out}/best.py")


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``memgym evolve``."""
    return add_recipe_command(
        subparsers, "evolve", help="evolve a memory program (cold start, capability refinement; resumable)",
        description="memgym evolve --config R.yaml [--out DIR] [--<field> value ...] | memgym evolve --resume DIR "
                    "(--help lists every recipe field)", run=cmd_evolve)
