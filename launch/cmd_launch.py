"""``memgym launch --accelerate-config NAME [--num-processes N] [--main-process-port P]
[--dry-run] train sft|adrpo --config R.yaml [overrides]``.

Parses the trainer's arguments with the stage's recipe parser (the one each process parses with:
a bad recipe, flag or value is one error here), builds ``accelerate launch --config_file
launch/accelerate/<NAME>.yaml [--num_processes N] [--main_process_port P] -m memgym.training.<stage>
--config R.yaml [overrides]``, prints it (shell-quoted) and runs it, returning its exit code
(127 when ``accelerate`` is not installed); ``--dry-run`` only prints it.
Source: ``docs/design.md`` § "Training stack" (launching is ``accelerate launch --config_file
launch/accelerate/<x>.yaml -m memgym.training.<entry> --config R.yaml``, wrapped by ``memgym launch``).
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

from memgym.launch.cmd_train import STAGES, stage_parser
from memgym.llm import runcard
from memgym.llm.errors import MemgymError

ACCELERATE_DIR = Path(__file__).resolve().parent / "accelerate"


class LaunchError(MemgymError, ValueError):
    """A launch request that cannot be turned into a command (message says what and why)."""

    kind = "usage"


def available_configs() -> list[str]:
    """Names of the accelerate configs shipped in ``launch/accelerate/`` (sorted, no ``.yaml``)."""
    return sorted(p.stem for p in ACCELERATE_DIR.glob("*.yaml"))


def _display_path(path: Path) -> str:
    try:
        return os.path.relpath(path) if path.resolve().is_relative_to(Path.cwd().resolve()) else str(path)
    except ValueError:  # another drive (Windows)
        return str(path)


def resolve_config(name: str) -> Path:
    """``launch/accelerate/<name>.yaml`` for a shipped config name, or ``name`` itself when it
    is an existing ``.yaml`` file. Raises :class:`LaunchError` listing the shipped configs."""
    if name.endswith((".yaml", ".yml")) and Path(name).is_file():
        return Path(name)
    path = ACCELERATE_DIR / f"{name}.yaml"
    if not path.is_file():
        raise LaunchError(f"unknown accelerate config {name!r}; available: {', '.join(available_configs())} "
                          f"(in {ACCELERATE_DIR}), or a path to a .yaml file")
    return path


def build_command(config: str, target: list[str], num_processes: int | None = None,
                  main_process_port: int | None = None) -> list[str]:
    """The ``accelerate launch`` argv for ``target`` = ``["train", stage, *trainer_args]``.

    Raises :class:`LaunchError` for an unknown config or stage, a target that is not
    ``train <stage>``, ``num_processes`` < 1 or a port outside 1..65535."""
    if len(target) < 2 or target[0] != "train":
        raise LaunchError(f"expected `train <stage> [args]` after the launch options, got {shlex.join(target) or '(nothing)'}")
    stage, rest = target[1], target[2:]
    if stage not in STAGES:
        raise LaunchError(f"unknown stage {stage!r}; expected one of {sorted(STAGES)}")
    path = resolve_config(config)
    cmd = ["accelerate", "launch", "--config_file", _display_path(path)]
    if num_processes is not None:
        if num_processes < 1:
            raise LaunchError(f"--num-processes must be >= 1, got {num_processes}")
        cmd += ["--num_processes", str(num_processes)]
    if main_process_port is not None:
        if not 0 < main_process_port < 65536:
            raise LaunchError(f"--main-process-port must be in 1..65535, got {main_process_port}")
        cmd += ["--main_process_port", str(main_process_port)]
    return cmd + ["-m", STAGES[stage][0], *rest]


def _env() -> dict:
    """The child's environment: this interpreter's bin dir first on PATH (so ``accelerate`` is
    the one installed beside memgym), ``HF_HUB_OFFLINE=1`` unless set, and ``MEMGYM_COMMAND``: this
    ``memgym launch`` command line, which each process's run card names."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env["MEMGYM_COMMAND"] = json.dumps(runcard.command())  # the run card of each process names this command
    return env


def _run(args) -> int:
    cmd = build_command(args.accelerate_config, args.target, args.num_processes, args.main_process_port)
    # the parser each process runs: a bad recipe, flag or value fails here, once, before any process starts
    stage_parser(args.target[1], f"memgym launch {shlex.join(args.target[:2])}").parse(args.target[2:])
    print(shlex.join(cmd), flush=True)
    if args.dry_run:
        return 0
    try:
        return subprocess.run(cmd, env=_env()).returncode
    except FileNotFoundError:
        print("memgym launch: `accelerate` not found; install it (pip install accelerate)", file=sys.stderr)
        return 127


def register(sub) -> None:
    p = sub.add_parser(
        "launch", help="run a trainer under `accelerate launch` (multi-GPU, DeepSpeed, CPU DDP)",
        description="Build `accelerate launch --config_file launch/accelerate/<NAME>.yaml -m memgym.training.<stage> "
                    "...`, print it, and run it (exit code passed through). Example: memgym launch "
                    "--accelerate-config deepspeed_zero2 --num-processes 8 train sft --config "
                    "launch/recipes/sft_qwen3_4b_zero2.yaml",
        epilog=f"shipped configs: {', '.join(available_configs())}")
    p.add_argument("--accelerate_config", "--accelerate-config", required=True, metavar="NAME",
                   help="a config name from launch/accelerate/ (or a path to an accelerate .yaml)")
    p.add_argument("--num_processes", "--num-processes", type=int, default=None, metavar="N",
                   help="override the config's num_processes (e.g. the number of training GPUs)")
    p.add_argument("--main_process_port", "--main-process-port", type=int, default=None, metavar="P",
                   help="rendezvous port (default: the config's, else 29500)")
    p.add_argument("--dry_run", "--dry-run", action="store_true", help="print the command, do not run it")
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="train STAGE ...",
                   help="`train sft|adrpo --config R.yaml [--<field> value ...]`")
    p.set_defaults(func=_run)
