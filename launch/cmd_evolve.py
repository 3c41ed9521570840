"""``memgym evolve``: capability-driven evolution of a memory program (PrisMem).

- ``memgym evolve --config R.yaml [--out DIR] [--<field> value ...]`` starts a run in DIR
  (the recipe and seed program are stored there);
- ``memgym evolve --resume DIR`` continues the run in DIR with the recipe stored there; a
  resumed run ends in the same state as an uninterrupted one;
- ``memgym evolve --from RUN --out DIR`` reruns a recorded coder run with no server (proposer
  replay; RUN's recipe unless ``--config`` is given; :mod:`memgym.evolution.search.proposers.replay`);
- ``memgym evolve experiment --config R.yaml --variants full,holistic,... --seeds 3 [--out DIR]``
  runs every ablation variant with every seed (:mod:`memgym.evolution.search.experiment`);
  ``memgym evolve experiment --resume DIR`` continues one without re-running finished runs.

Every path goes through :func:`memgym.evolution.search.api.evolve`. Writes DIR/report.md,
capabilities.png, summary.json and best.py (see :mod:`memgym.evolution.search.report`). Exit 0 on
success (also when a budget stopped the run early: the report says so); errors are raised and
mapped by :func:`memgym.launch.cli.run_command`: 2 for a bad recipe or argument, a damaged run state, a
recipe.json that no longer matches the stored run, a DIR that already holds a run or other
files, or a DIR another process is working in, or a replay that does not match its recording;
1 when the seed program itself cannot run, the coder's endpoint failed 3 rounds in a row (state
saved: ``--resume`` continues) or failed every round of a shorter run (the run is written, the
seed frozen: nothing was evolved). A fresh start that fails leaves nothing behind in DIR.
"""
from __future__ import annotations

from pathlib import Path

from memgym.llm.errors import ConfigError

DESCRIPTION = ("Capability-driven evolution of a memory program (PrisMem): cold start, capability refinement, "
               "trace-guided integration, frozen final program on the test split. memgym evolve --config R.yaml "
               "[--out DIR] [--<field> value ...]; memgym evolve --resume DIR continues a run; memgym evolve "
               "experiment --config R.yaml --variants ... --seeds N runs the ablations.")


def _config_from_dir(run_dir: str):
    from memgym.evolution.search.config import EvolveConfig
    from memgym.evolution.search.rundir import RunStateError, read_json

    path = Path(run_dir) / "recipe.json"
    if not path.is_file():
        raise ConfigError(f"no run to resume in {run_dir}: {path} is missing")
    d = read_json(path)
    if not isinstance(d, dict):
        raise RunStateError(f"{path}: damaged recipe: a JSON object expected, got {type(d).__name__}")
    cfg = EvolveConfig.from_record(d)
    cfg.out = str(run_dir)
    return cfg


def cmd_experiment(args) -> int:
    """``memgym evolve experiment`` (see :mod:`memgym.evolution.search.experiment`)."""
    from memgym.evolution.search.experiment import VARIANTS, Experiment
    from memgym.llm.recipe import given_fields, recipe_configs

    if args.resume is not None:
        other = given_fields(args) + (["--config"] if args.config else []) + \
            [f for f, v in (("--variants", args.variants), ("--seeds", args.seeds)) if v is not None]
        if other:
            raise ConfigError(f"--resume takes no other arguments (the recipe is stored in {args.resume}); got "
                              f"{' '.join(other)}")
        exp = Experiment.from_dir(args.resume)
    else:
        (cfg,) = recipe_configs(args)
        exp = Experiment(cfg, args.variants or ",".join(VARIANTS), args.seeds or 3)
    data = exp.run(resume=args.resume is not None)
    print((exp.root / "experiment.md").read_text(encoding="utf-8"))
    print(f"{data['finished_runs']} runs; report: {exp.root}/experiment.md, boundary.png")
    return 0


def cmd_evolve(args) -> int:
    from memgym.evolution.search import api
    from memgym.llm.recipe import given_fields, recipe_configs

    if args.resume is not None:
        other = given_fields(args, allowed=("progress",)) + (["--config"] if args.config else [])
        if other:
            raise ConfigError(f"--resume takes no other arguments than --no_progress (the recipe is stored in "
                              f"{args.resume}); got {' '.join(other)}")
        cfg = _config_from_dir(args.resume)
        cfg.progress = args.progress  # display only: the run state is unchanged
    else:
        (cfg,) = recipe_configs(args)
        if cfg.replay_from and Path(cfg.out).resolve() == Path(cfg.replay_from).resolve():
            raise ConfigError(f"--from {cfg.replay_from}: give the replayed run its own --out DIR")
    result = api.evolve(cfg, resume=args.resume is not None)
    _print(result.summary, cfg.out)
    return 0


def _print(s: dict, out: str) -> None:
    """The per-capability (and, for BEAM / LongMemEval, per-ability) tables, valid then test:
    seed, each specialist, the frozen program (:func:`memgym.evolution.search.report.console_summary`)."""
    from memgym.evolution.search.report import console_summary
    print(console_summary(s, out))
    from memgym.evolution.execution.confine import current_label

    label = current_label()
    if not label.startswith("kernel:"):
        print(f"sandbox: {label}")


def _from_run(argv: list[str]) -> dict:
    """``--from RUN``: RUN's stored recipe (unless ``--config`` is given) with proposer replay of
    RUN, as defaults that flags override; ``{}`` without ``--from``."""
    import dataclasses

    from memgym.llm.recipe import RECIPE_FLAGS, option_value

    src = option_value(argv, "--from")
    if src is None:
        return {}
    if not (Path(src) / "recipe.json").is_file():
        raise ConfigError(f"--from {src}: no recorded run there ({Path(src) / 'recipe.json'} is missing)")
    recipe = {} if option_value(argv, *RECIPE_FLAGS) else dataclasses.asdict(_config_from_dir(src))
    recipe.pop("out", None)
    return {**recipe, "proposer": "replay", "replay_from": src}


def _positive_int(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"must be a positive integer, got {text!r}")
    return int(text)


def make_parser(prog: str):
    """The recipe parser of ``memgym evolve`` (:class:`memgym.evolution.search.config.EvolveConfig`)."""
    from memgym.evolution.search.config import EvolveConfig
    from memgym.llm.recipe import RecipeParser

    p = RecipeParser([EvolveConfig], prog=prog, description=DESCRIPTION, defaults=_from_run,
                     epilog="memgym evolve experiment --config R.yaml --variants ... --seeds N: every ablation "
                            "variant x every seed under one recipe (PrisMem Table 4); `memgym evolve experiment "
                            "--help` lists its options.")
    p.add_argument("--from", dest="replay_source", metavar="RUN", default=None,
                   help="replay the recorded coder run RUN with no server (proposer replay; RUN's recipe.json unless "
                        "--config is given)")
    p.add_argument("--resume", metavar="DIR", default=None,
                   help="continue the run in DIR with the recipe stored there (no other arguments but "
                        "--no_progress); a resumed run ends in the same state as an uninterrupted one")
    p.set_defaults(func=cmd_evolve)
    return p


def make_experiment_parser(prog: str):
    """The recipe parser of ``memgym evolve experiment`` (every ablation variant x every seed)."""
    from memgym.evolution.search.config import EvolveConfig
    from memgym.evolution.search.experiment import VARIANTS
    from memgym.llm.recipe import RecipeParser

    e = RecipeParser([EvolveConfig], prog=prog,
                     description="Every ablation variant x every seed under one recipe (PrisMem Table 4): memgym "
                                 f"evolve experiment --config R.yaml --variants {','.join(VARIANTS)} --seeds 3 "
                                 "[--out DIR] [--<field> value ...]; memgym evolve experiment --resume DIR "
                                 "continues one. Writes DIR/experiment.md, experiment.json, boundary.png.")
    e.add_argument("--variants", metavar="V,V,...", default=None,
                   help=f"comma-separated variants (default: all of {','.join(VARIANTS)})")
    e.add_argument("--seeds", type=_positive_int, metavar="N", default=None, help="seeds per variant (default 3)")
    e.add_argument("--resume", metavar="DIR", default=None,
                   help="continue the experiment in DIR (no other arguments) without re-running finished runs")
    e.set_defaults(func=cmd_experiment)
    return e


HELP = "evolve a memory program (cold start, capability refinement, integration; resumable); " \
       "`memgym evolve experiment` runs the ablations"


def register(subparsers) -> None:
    """Add ``memgym evolve`` and ``evolve experiment`` (their parsers built when chosen)."""
    from memgym.launch.registry import add_recipe_command

    add_recipe_command(subparsers, "evolve", make_parser, help=HELP,
                       subcommands={"experiment": make_experiment_parser})
