"""``memgym train sft|adrpo --config R.yaml [--<field> value ...]``: run a trainer in this
process (one CPU or one GPU). For several processes, DeepSpeed or a multi-GPU box, wrap the same
arguments with ``memgym launch`` (see ``launch/cmd_launch.py``).

Each stage is a module ``training.<stage>`` with ``main(argv) -> int`` that parses its own
TRL-style arguments (``trl.TrlParser``: a YAML recipe plus CLI overrides), so ``memgym train
sft --help`` lists every recipe field."""
from __future__ import annotations

import importlib
import sys

from launch.passthrough import add_recipe_command

#: stage -> (module, one-line help)
STAGES = {
    "sft": ("training.sft", "supervised fine-tuning on expert trajectories (TRL SFTTrainer, LoRA or full)"),
    "adrpo": ("training.adrpo", "ADRPO: GRPO with dense session rewards and contribution weighting"),
}


def run_stage(stage: str, argv: list[str]) -> int:
    """Import ``training.<stage>`` and return its ``main(argv)``. Returns 2 with a message
    when the stage is unknown or its module is not installed."""
    if stage not in STAGES:
        print(f"memgym train: unknown stage {stage!r}; expected one of {sorted(STAGES)}", file=sys.stderr)
        return 2
    module = STAGES[stage][0]
    try:
        mod = importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name == module:
            print(f"memgym train {stage}: module {module} is not available in this install", file=sys.stderr)
            return 2
        raise
    return int(mod.main(list(argv)) or 0)


def register(sub) -> None:
    p = sub.add_parser("train", help="train the memory extractor: sft | adrpo (one process)",
                       description="Train the memory extractor in this process. Each stage reads a YAML "
                                   "recipe (--config R.yaml, alias --recipe) and takes any recipe field as an "
                                   "override flag; `memgym train STAGE --help` lists them. For multi-process or "
                                   "DeepSpeed runs use `memgym launch`.")
    stages = p.add_subparsers(dest="train_command", metavar="STAGE")
    stages.required = True
    for name, (module, help_) in STAGES.items():
        add_recipe_command(stages, name, help=help_,
                           description=f"memgym train {name} --config R.yaml [--<field> value ...] "
                                       f"(runs {module}.main; --help lists the fields)",
                           run=lambda argv, _s=name: run_stage(_s, argv))
