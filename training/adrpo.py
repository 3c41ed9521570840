"""The ADRPO entry point (TRL's ``scripts/grpo.py`` shape): parse ``ADRPOConfig`` +
``PolicyModelConfig`` from a recipe and CLI overrides, build policy, reward samples, session
reward and trainer, train, save. Run: ``memgym train adrpo --config R.yaml [--field value ...]``.
"""
from __future__ import annotations

import copy
import logging
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from memgym.memory_bank.actions import MANAGERS
from memgym.rewards.session_reward import SessionReward
from memgym.training.adrpo_config import ADRPOConfig
from memgym.training.adrpo_trainer import ADRPOTrainer
from memgym.training.common import PolicyModelConfig, resume_arg  # noqa: F401  (resume_arg: re-exported)

logger = logging.getLogger(__name__)
PROG = "memgym train adrpo"


def trajectory_paths(names: Sequence[str]) -> list[Path]:
    """Each name as a path, or looked up as ``$MEMGYM_DATA/expert/<name>.jsonl``
    (:func:`memgym.data_synth.extractors.resolve_expert_path`; FileNotFoundError naming both)."""
    from memgym.data_synth.extractors import resolve_expert_path

    return [resolve_expert_path(n) for n in names]


def build_reward(args: ADRPOConfig, tokenizer, embedder, rt=None) -> SessionReward:
    """The :class:`SessionReward` of ``args``: answer/judge backends loaded from their specs
    (with the sqlite response cache unless ``reward_cache: none``; ``rt``: a
    :class:`memgym.llm.runtime.Runtime` already opened, else one is made here)."""
    from memgym.llm.base import GenerationParams
    from memgym.llm.runtime import Runtime

    rt = rt or Runtime.from_config(cache=args.reward_cache)
    answer = rt.backend(args.answer_model, role="answer") if args.answer_model else None
    judge = rt.backend(args.judge_model, role="judge") if args.judge_model else None
    return SessionReward(args.reward_config(), embedder=embedder, tokenizer=tokenizer, answer_backend=answer,
                         judge_backend=judge,
                         answer_params=GenerationParams(max_new_tokens=args.answer_max_new_tokens, temperature=0))


def trainer_class(args: ADRPOConfig) -> type[ADRPOTrainer]:
    """:class:`ADRPOTrainer`, or :class:`memgym.training.adrpo_eq12.ADRPOEq12Trainer` for ``weighting: unclipped``."""
    if args.weighting == "unclipped":
        from memgym.training.adrpo_eq12 import ADRPOEq12Trainer

        return ADRPOEq12Trainer
    return ADRPOTrainer


def reward_rows(args: ADRPOConfig, paths, *, tokenizer, embedder) -> list:
    """The candidate rollout rows of ``args`` before selection
    (:func:`memgym.training.segment_samples.reward_rows` with the recipe's data fields)."""
    from memgym.training.segment_samples import reward_rows as rows

    return rows(paths, tokenizer=tokenizer, embedder=embedder, managers=args.managers,
                segment_tokens=args.segment_tokens, dataset=args.dataset, data_path=args.data_path,
                qa_path=args.qa_path)


def build_trainer(args: ADRPOConfig, model_args: PolicyModelConfig | None = None, callbacks=None) -> ADRPOTrainer:
    """Load the policy (``init_from`` or ``model_name_or_path``; LoRA per ``model_args``), build
    the reward samples, the reward, the in-trainer measurement (:mod:`memgym.training.callbacks`, whose
    validation rows are the eval set) and the trainer.
    """
    from memgym.llm.embeddings import load_embedder
    from memgym.llm.runtime import Runtime
    from memgym.training.adrpo_data import select_samples
    from memgym.training.callbacks import bind_memory_eval, build_memory_eval
    from memgym.training.common import load_policy, outside_zero3

    # files and caches first: a missing trajectory or a corrupt cache fails before the policy loads
    paths = trajectory_paths(args.train_trajectories)
    rt = Runtime.from_config(cache=args.reward_cache)
    with outside_zero3(args):  # every model but the policy is loaded whole on every process
        embedder = load_embedder(args.embedder)
    policy = load_policy(model_args or PolicyModelConfig(), init_from=args.init_from)
    samples = reward_rows(args, paths, tokenizer=policy.tokenizer, embedder=embedder)
    samples = select_samples(samples, sessions=args.sessions, max_prompt_tokens=args.max_prompt_tokens,
                             tokenizer=policy.tokenizer, whole_sessions=args.mode == "joint",
                             keys=args.row_keys)
    with outside_zero3(args):
        reward = build_reward(args, policy.tokenizer, embedder, rt)
    if args.screen_rows:
        samples = screen(args, policy, samples, reward)
    logger.info("ADRPO: %d rows from %s", len(samples), args.train_trajectories)
    callback, eval_rows = build_memory_eval(args, policy.tokenizer, embedder, reward, managers=MANAGERS,
                                            segment_tokens=args.segment_tokens,
                                            max_prompt_tokens=args.max_prompt_tokens)
    from memgym.training.callbacks import RunCardCallback

    card = RunCardCallback([args, model_args or PolicyModelConfig()],
                           {"policy": (model_args or PolicyModelConfig()).model_name_or_path, "init_from": args.init_from,
                            "embedder": args.embedder, "answer_model": args.answer_model,
                            "judge_model": args.judge_model}, runtime=rt)
    callbacks = [*(callbacks or []), *([callback] if callback is not None else []), card]
    return bind_memory_eval(trainer_class(args)(
        policy.model, args=args, samples=samples, reward=reward, processing_class=policy.tokenizer,
        peft_config=policy.peft_config, callbacks=callbacks,
        eval_samples=[r for r in eval_rows if r.manager in args.managers] or None))


def screen(args: ADRPOConfig, policy, samples: list, reward) -> list:
    """``args.screen_rows`` rows with reward spread (:func:`memgym.training.adrpo_data.screen_rows`),
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
        chosen, report = screen_rows(samples, reward, backend, n=args.screen_rows,
                                     num_generations=args.num_generations, max_new_tokens=args.max_completion_length,
                                     temperature=args.temperature, top_p=args.top_p, seed=args.seed)
    policy.model.train()
    out = Path(args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "screen.json").write_text(json.dumps({"chosen": [s.key for s in chosen], "tried": report}, indent=2) + "\n")
    return chosen


def train(args: ADRPOConfig, trainer: ADRPOTrainer | None = None) -> ADRPOTrainer:
    """Train (resuming when ``resume_from_checkpoint`` is set), then save the final model /
    adapter and tokenizer to ``output_dir``; ``trainer`` defaults to :func:`build_trainer`.
    Returns the trainer (its ``state.log_history`` holds every logged step)."""
    trainer = trainer if trainer is not None else build_trainer(args)
    trainer.train(resume_from_checkpoint=resume_arg(args.resume_from_checkpoint))
    trainer.save_model(args.output_dir)
    if trainer.accelerator.is_main_process:
        trainer.processing_class.save_pretrained(args.output_dir)
        trainer.save_state()  # trainer_state.json: log_history with every evaluation's measurement
    return trainer


DESCRIPTION = "ADRPO: GRPO with dense session rewards and contribution-aware weighting (TRL GRPOTrainer subclass)."


def make_parser(prog: str | None = None):
    """The recipe parser of ``(ADRPOConfig, PolicyModelConfig)`` (``memgym train adrpo`` and
    ``python -m memgym.training.adrpo``)."""
    from memgym.training.common import training_parser

    return training_parser((ADRPOConfig, PolicyModelConfig), prog or PROG, DESCRIPTION)


def parse_args(argv: list[str] | None = None) -> tuple[ADRPOConfig, PolicyModelConfig]:
    """``(ADRPOConfig, PolicyModelConfig)`` from ``--config R.yaml`` + CLI overrides (default
    ``sys.argv[1:]``), with CPU-safe defaults on machines without CUDA."""
    from memgym.llm.recipe import recipe_configs

    return recipe_configs(make_parser().parse(sys.argv[1:] if argv is None else argv))


def main(argv: list[str] | None = None) -> int:
    """``python -m memgym.training.adrpo --config R.yaml [--field value ...]`` (what ``memgym launch``
    runs in each process): parse, then :func:`train_and_report`. A user error is one stderr line
    and exit status 2 or 1 (:func:`memgym.llm.errors.report_errors`)."""
    from memgym.llm.errors import report_errors

    return report_errors(PROG, lambda: train_and_report(*parse_args(argv)))


def train_and_report(args: ADRPOConfig, model_args: PolicyModelConfig) -> int:
    """Build the trainer, train, print the last step's rewards; returns 0."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    trainer = build_trainer(args, model_args)
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
