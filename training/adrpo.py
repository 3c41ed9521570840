"""The ADRPO entry point (TRL's ``scripts/grpo.py`` shape): parse the recipe's sections
(:data:`CONFIG_TYPES`) from a recipe and CLI overrides, build policy, reward rows, session
reward and trainer, train, save. Run: ``memgym train adrpo --config R.yaml [--field value ...]``.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import sys
from pathlib import Path

from memgym.rewards.session_reward import SessionReward, SessionRewardConfig
from memgym.training.adrpo_config import ADRPOConfig, ADRPOScriptArguments, check_recipe
from memgym.training.adrpo_trainer import ADRPOTrainer
from memgym.training.common import PolicyModelConfig, resume_arg

logger = logging.getLogger(__name__)
PROG = "memgym train adrpo"
#: The recipe's sections, in the order :func:`parse_args` returns them (TRL's ``grpo.py`` split, plus the reward's).
CONFIG_TYPES = (ADRPOScriptArguments, SessionRewardConfig, ADRPOConfig, PolicyModelConfig)


def build_reward(script_args: ADRPOScriptArguments, reward_args: SessionRewardConfig, tokenizer, embedder,
                 rt=None) -> SessionReward:
    """The :class:`SessionReward` of ``reward_args``: answer/judge backends loaded from the script's
    specs (with the sqlite response cache unless ``reward_cache: none``; ``rt``: a
    :class:`memgym.llm.runtime.Runtime` already opened, else one is made here)."""
    from memgym.llm.base import GenerationParams
    from memgym.llm.runtime import Runtime

    rt = rt or Runtime.from_config(cache=script_args.reward_cache)
    answer = rt.backend(script_args.answer_model, role="answer") if script_args.answer_model else None
    judge = rt.backend(script_args.judge_model, role="judge") if script_args.judge_model else None
    return SessionReward(reward_args, embedder=embedder, tokenizer=tokenizer, answer_backend=answer,
                         judge_backend=judge, answer_params=GenerationParams(
                             max_new_tokens=script_args.answer_max_new_tokens, temperature=0))


def trainer_class(args: ADRPOConfig) -> type[ADRPOTrainer]:
    """:class:`ADRPOTrainer`, or :class:`memgym.training.adrpo_eq12.ADRPOEq12Trainer` for ``weighting: unclipped``."""
    if args.weighting == "unclipped":
        from memgym.training.adrpo_eq12 import ADRPOEq12Trainer

        return ADRPOEq12Trainer
    return ADRPOTrainer


def train_rows(script_args: ADRPOScriptArguments, reward_args: SessionRewardConfig, *, tokenizer, embedder) -> list:
    """The recipe's training rows before ``screen_rows`` (:func:`memgym.training.reward_rows.reward_rows`)."""
    from memgym.training.reward_rows import reward_rows

    a = script_args
    return reward_rows(a.train_trajectories, tokenizer=tokenizer, embedder=embedder, managers=a.managers,
                       segment_tokens=a.segment_tokens, dataset=a.dataset, data_path=a.data_path, qa_path=a.qa_path,
                       sessions=a.sessions, max_prompt_tokens=a.max_prompt_tokens, keys=a.row_keys,
                       whole_sessions=reward_args.mode == "joint")


def build_trainer(script_args: ADRPOScriptArguments, reward_args: SessionRewardConfig, args: ADRPOConfig,
                  model_args: PolicyModelConfig | None = None, callbacks=None) -> ADRPOTrainer:
    """Load the policy (``init_from`` or ``model_name_or_path``; LoRA per ``model_args``), build
    the training and validation rows (one pipeline: :mod:`memgym.training.reward_rows`), the reward,
    the in-trainer measurement over the validation rows (:mod:`memgym.training.callbacks`; they are
    also the trainer's eval set) and the trainer. Raises :class:`ADRPOConfigError` first for
    sections that do not fit together (:func:`memgym.training.adrpo_config.check_recipe`).
    """
    from memgym.llm.embeddings import load_embedder
    from memgym.llm.runtime import Runtime
    from memgym.training.callbacks import RunCardCallback, bind_memory_eval, build_memory_eval
    from memgym.training.common import load_policy, outside_zero3
    from memgym.training.reward_rows import trajectory_paths

    model_args = model_args or PolicyModelConfig()
    check_recipe(script_args, reward_args)
    # files and caches first: a missing trajectory or a corrupt cache fails before the policy loads
    trajectory_paths(script_args.train_trajectories)
    rt = Runtime.from_config(cache=script_args.reward_cache)
    with outside_zero3(args):  # every model but the policy is loaded whole on every process
        embedder = load_embedder(script_args.embedder)
    policy = load_policy(model_args, init_from=script_args.init_from)
    samples = train_rows(script_args, reward_args, tokenizer=policy.tokenizer, embedder=embedder)
    with outside_zero3(args):
        reward = build_reward(script_args, reward_args, policy.tokenizer, embedder, rt)
    if script_args.screen_rows:
        samples = screen(script_args, args, policy, samples, reward)
    logger.info("ADRPO: %d rows from %s", len(samples), script_args.train_trajectories)
    eval_rows = script_args.validation_rows(policy.tokenizer, embedder, segment_tokens=script_args.segment_tokens,
                                            max_prompt_tokens=script_args.max_prompt_tokens)
    callback = build_memory_eval(script_args, eval_rows, policy.tokenizer, embedder, reward,
                                 segment_tokens=script_args.segment_tokens)
    card = RunCardCallback([script_args, reward_args, args, model_args],
                           {"policy": model_args.model_name_or_path, "init_from": script_args.init_from,
                            "embedder": script_args.embedder, "answer_model": script_args.answer_model,
                            "judge_model": script_args.judge_model}, runtime=rt)
    callbacks = [*(callbacks or []), *([callback] if callback is not None else []), card]
    return bind_memory_eval(trainer_class(args)(
        policy.model, args=args, samples=samples, reward=reward, processing_class=policy.tokenizer,
        peft_config=policy.peft_config, callbacks=callbacks,
        eval_samples=[r for r in eval_rows if r.manager in script_args.managers] or None))


def screen(script_args: ADRPOScriptArguments, args: ADRPOConfig, policy, samples: list, reward) -> list:
    """``script_args.screen_rows`` rows with reward spread (:func:`memgym.training.adrpo_data.screen_rows`),
    sampled from the initial policy as training samples it; the screen is written to
    ``<output_dir>/screen.json``. Every process screens the same rows with the same seed; under
    DeepSpeed ZeRO-3 each gathers the whole policy for it (:func:`memgym.training.common.gathered`)."""
    import json

    from memgym.llm.hf_backend import HFBackend
    from memgym.training.adrpo_data import screen_rows
    from memgym.training.common import gathered, outside_zero3

    backend = HFBackend(policy.model, copy.deepcopy(policy.tokenizer), device=str(policy.model.device),
                        batch_size=args.num_generations, model_id="adrpo-screen")
    with gathered(policy.model), outside_zero3(args):
        chosen, report = screen_rows(samples, reward, backend, n=script_args.screen_rows,
                                     num_generations=args.num_generations, max_new_tokens=args.max_completion_length,
                                     temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    policy.model.train()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "screen.json").write_text(json.dumps({"chosen": [s.key for s in chosen], "tried": report}, indent=2) + "\n")
    return chosen


def train(args: ADRPOConfig, trainer: ADRPOTrainer) -> ADRPOTrainer:
    """Train ``trainer`` (:func:`build_trainer`; resuming when ``resume_from_checkpoint`` is set), then
    save the final model / adapter and tokenizer to ``output_dir``. Returns the trainer (its
    ``state.log_history`` holds every logged step)."""
    trainer.train(resume_from_checkpoint=resume_arg(args.resume_from_checkpoint))
    trainer.save_model(args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(args.output_dir)
        trainer.save_state()  # trainer_state.json: log_history with every evaluation's measurement
    return trainer


DESCRIPTION = "ADRPO: GRPO with dense session rewards and contribution-aware weighting (TRL GRPOTrainer subclass)."


def make_parser(prog: str | None = None):
    """The recipe parser of :data:`CONFIG_TYPES` (``memgym train adrpo`` and
    ``python -m memgym.training.adrpo``)."""
    from memgym.training.common import training_parser

    return training_parser(CONFIG_TYPES, prog or PROG, DESCRIPTION)


def parse_args(argv: list[str] | None = None) -> tuple[ADRPOScriptArguments, SessionRewardConfig, ADRPOConfig,
                                                       PolicyModelConfig]:
    """The :data:`CONFIG_TYPES` sections from ``--config R.yaml`` + CLI overrides (default
    ``sys.argv[1:]``), with CPU-safe defaults on machines without CUDA."""
    from memgym.llm.recipe import recipe_configs

    return recipe_configs(make_parser().parse(sys.argv[1:] if argv is None else argv))


def main(argv: list[str] | None = None) -> int:
    """``python -m memgym.training.adrpo --config R.yaml [--field value ...]`` (what ``memgym launch``
    runs in each process): parse, then :func:`train_and_report`. A user error is one stderr line
    and exit status 2 or 1 (:func:`memgym.llm.errors.report_errors`)."""
    from memgym.llm.errors import report_errors

    return report_errors(PROG, lambda: train_and_report(*parse_args(argv)))


def train_and_report(script_args: ADRPOScriptArguments, reward_args: SessionRewardConfig, args: ADRPOConfig,
                     model_args: PolicyModelConfig) -> int:
    """Build the trainer, train, print the last step's rewards; returns 0."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer = build_trainer(script_args, reward_args, args, model_args)
    train(args, trainer)
    last = next((h for h in reversed(trainer.state.log_history) if "reward" in h), {})
    summary = {k: round(v, 4) for k, v in last.items() if isinstance(v, (int, float)) and math.isfinite(v)
               and (k.startswith(("reward", "dominant", "frac_reward")) or k in ("kl", "step"))}
    if trainer.accelerator.is_main_process:
        print(f"{PROG}: {trainer.state.global_step} steps, saved to {args.output_dir}; last step {summary}")
    # every process leaves the process group before exiting: a gloo group torn down by interpreter exit
    # can abort a rank ("terminate called without an active exception") after a finished run
    trainer.accelerator.wait_for_everyone()
    trainer.accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
