"""``memgym train sft|adrpo --config R.yaml [--<field> value ...]``: run a trainer in this
process (one CPU or one GPU). For several processes, DeepSpeed or a multi-GPU box, wrap the same
arguments with ``memgym launch`` (see ``launch/cmd_launch.py``).

Each stage is a module ``training.<stage>`` with ``make_parser(prog)`` (its
:class:`memgym.llm.recipe.RecipeParser`, the one ``python -m memgym.training.<stage>`` parses with,
so ``memgym train sft --help`` lists every recipe field) and ``train_and_report(*configs)``. On a
machine without CUDA ``use_cpu true, bf16/fp16 false`` apply over the recipe
(:func:`memgym.training.common.device_defaults`)."""
from __future__ import annotations

import importlib

from memgym.launch.registry import add_recipe_command

#: stage -> (module, one-line help)
STAGES = {
    "sft": ("memgym.training.sft", "supervised fine-tuning on expert trajectories (TRL SFTTrainer, LoRA or full)"),
    "adrpo": ("memgym.training.adrpo", "ADRPO: GRPO with dense session rewards and contribution weighting"),
}


def stage_parser(stage: str, prog: str):
    """The recipe parser of training stage ``stage`` (``func``: train in this process)."""
    from memgym.llm.recipe import recipe_configs

    mod = importlib.import_module(STAGES[stage][0])
    p = mod.make_parser(prog=prog)
    p.set_defaults(func=lambda args: mod.train_and_report(*recipe_configs(args)))
    return p


def register(sub) -> None:
    p = sub.add_parser("train", help="train the memory extractor: sft | adrpo (one process)",
                       description="Train the memory extractor in this process. Each stage reads a YAML "
                                   "recipe (--config R.yaml, alias --recipe) and takes any recipe field as an "
                                   "override flag; `memgym train STAGE --help` lists them. For multi-process or "
                                   "DeepSpeed runs use `memgym launch`.")
    stages = p.add_subparsers(dest="train_command", metavar="STAGE")
    stages.required = True
    for name, (_module, help_) in STAGES.items():
        add_recipe_command(stages, name, lambda prog, stage=name: stage_parser(stage, prog), help=help_)
