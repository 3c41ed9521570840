"""Supervised fine-tuning of a memory manager on expert trajectories (TRL ``SFTTrainer``,
conversational prompt-completion, completion-only loss; LoRA or full).

Outputs in ``output_dir``: the model or adapter + tokenizer, ``metrics.json``, ``loss.png``
and ``report.md``. Run: ``memgym train sft --config R.yaml [--field value ...]``.
"""
from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from trl import SFTConfig

from memgym.data_synth.datasets import DATASETS
from memgym.llm.checks import check_fields
from memgym.memory_bank.actions import MANAGERS
from memgym.llm.embeddings import EMBEDDER_HELP, check_embedder_spec
from memgym.training.callbacks import MemoryEvalFields, bind_memory_eval
from memgym.training.common import PolicyModelConfig, load_policy, outside_zero3, resume_arg, training_parser
from memgym.training.sft_data import check_managers, drop_overlong, sft_examples

PROG = "memgym train sft"


def _expert(name: str) -> list[str]:
    from memgym.data_synth.paths import expert_dir

    return [str(expert_dir() / name)]


@dataclass
class SFTScriptArguments(MemoryEvalFields):
    """memgym SFT: fine-tune a memory manager on expert trajectories (TRL SFTTrainer)."""

    _argument_group_name = "memgym SFT: the expert trajectories and the examples built from them"
    CHECKS = {"max_examples": {"min": 1}, "max_eval_examples": {"min": 1}, "segment_tokens": {"min": 1},
              "max_empty_per_manager": {"min": 0}, "memory_eval_rows": {"min": 1},
              "memory_eval_heldout_turns": {"min": 1}, "memory_eval_max_new_tokens": {"min": 1}}

    train_trajectories: list[str] = field(
        default_factory=lambda: _expert("conv-26.jsonl"),
        metadata={"help": "expert trajectory JSONL files to train on, or names looked up in $MEMGYM_DATA/expert "
                          "(default $MEMGYM_DATA/expert/conv-26.jsonl)"})
    eval_trajectories: list[str] = field(
        default_factory=lambda: _expert("conv-30.jsonl"),
        metadata={"help": "expert trajectory JSONL files to validate on (default "
                          "$MEMGYM_DATA/expert/conv-30.jsonl); empty list = no validation"})
    dataset: str = field(default="locomo", metadata={"help": f"dataset the trajectories refer to: {DATASETS}"})
    data_path: str | None = field(default=None, metadata={"help": "the dataset file (default: under $MEMGYM_DATA)"})
    managers: list[str] = field(default_factory=lambda: list(MANAGERS),
                                metadata={"help": f"managers to train, from {MANAGERS}"})
    embedder: str = field(default="minilm", metadata={
        "help": f"ranks the <=20 entries a prompt shows, as at inference ('none': the 20 most recently updated): "
                f"{EMBEDDER_HELP}"})
    max_examples: int | None = field(default=None, metadata={
        "help": "train on a random subset (seeded by --seed) of at most this many examples, after dropping "
                "over-long ones"})
    max_eval_examples: int | None = field(default=None, metadata={
        "help": "evaluate on at most this many examples of each split (train and validation)"})
    segment_tokens: int | None = field(default=None, metadata={
        "help": "cut each expert session into segments of whole turns of at most this many transcript tokens, "
                "each with the expert operations that belong to it (memgym.training.sft_segments); unset = whole sessions"})
    max_empty_per_manager: int | None = field(default=None, metadata={
        "help": "keep at most this many examples per manager whose expert output changes nothing (core NONE, "
                "empty operation list), a seeded choice after the length filter; unset = keep all"})

    def __post_init__(self):
        check_fields(self)  # string -> one-element list, counts (memgym.llm.checks)
        if self.dataset not in DATASETS:
            raise ValueError(f"dataset must be one of {DATASETS}, got {self.dataset!r}")
        check_embedder_spec(self.embedder)
        if not self.train_trajectories:
            raise ValueError("train_trajectories is empty")
        for name in ("max_examples", "max_eval_examples"):
            v = getattr(self, name)
            if v is not None and v < 1:
                raise ValueError(f"{name} must be >= 1 or unset, got {v}")
        self.managers = list(check_managers(self.managers))


@dataclass
class SFTTrainingConfig(SFTConfig):
    """TRL's ``SFTConfig`` unchanged; the subclass only heads its fields in ``--help``."""

    _argument_group_name = ("trainer: every trl.SFTConfig field (transformers TrainingArguments + SFT; "
                            "https://huggingface.co/docs/trl/main/en/sft_trainer#trl.SFTConfig)")


DESCRIPTION = ("Fine-tune a memory manager on expert trajectories (TRL SFTTrainer). Use --config R.yaml for a "
               "recipe; any field below overrides it.")


def make_parser(prog: str | None = None):
    """The recipe parser of ``(SFTScriptArguments, SFTTrainingConfig, PolicyModelConfig)``
    (``memgym train sft`` and ``python -m memgym.training.sft``)."""
    return training_parser((SFTScriptArguments, SFTTrainingConfig, PolicyModelConfig), prog or PROG, DESCRIPTION)


def parse_args(argv: list[str] | None = None):
    """``(SFTScriptArguments, SFTTrainingConfig, PolicyModelConfig)`` from ``--config R.yaml`` +
    CLI overrides (default ``sys.argv[1:]``), with CPU-safe defaults on machines without CUDA."""
    from memgym.llm.recipe import recipe_configs

    return recipe_configs(make_parser().parse(sys.argv[1:] if argv is None else argv))


def _subset(ds, n: int | None, seed: int):
    if n is None or len(ds) <= n:
        return ds
    return ds.shuffle(seed=seed).select(range(n))


@dataclass
class SFTData:
    """The prepared splits: ``train`` / ``valid`` (``datasets.Dataset`` of prompt-completion
    rows, ``valid`` None without eval trajectories), ``train_probe`` (the train rows whose loss
    is measured before and after training) and the length reports (``memgym.training.sft_data.LengthReport``)."""

    train: object
    valid: object | None
    train_probe: object
    lengths: dict


def build_data(script_args: SFTScriptArguments, tokenizer, max_length: int | None, seed: int,
               progress: bool = True) -> SFTData:
    """The SFT splits, length-filtered and subsampled. Raises what
    :func:`memgym.training.sft_data.sft_examples` raises, ValueError when a split has no example that fits.
    """
    from memgym.llm.embeddings import load_embedder

    emb = load_embedder(script_args.embedder)
    common = dict(dataset=script_args.dataset, data_path=script_args.data_path, embedder=emb,
                  managers=script_args.managers, progress=progress)
    from memgym.data_synth.extractors import resolve_expert_path

    def examples(paths, split: str):
        if script_args.segment_tokens is None:
            ds = sft_examples(paths, **common)
            return _balanced(drop_overlong(ds, tokenizer, max_length), script_args, seed, split, lengths)
        from datasets import Dataset

        from memgym.training.sft_data import expert_session_states
        from memgym.training.sft_segments import segment_rows

        states = expert_session_states(paths, dataset=script_args.dataset, data_path=script_args.data_path)
        rows, stats = segment_rows(states, tokenizer=tokenizer, segment_tokens=script_args.segment_tokens,
                                   embedder=emb, managers=script_args.managers)
        lengths[f"{split}_segments"] = stats.to_json()
        return _balanced(drop_overlong(Dataset.from_list(rows), tokenizer, max_length), script_args, seed, split,
                         lengths)

    lengths: dict = {}
    train = examples([resolve_expert_path(p) for p in script_args.train_trajectories], "train")
    train = _subset(train, script_args.max_examples, seed)
    valid = None
    if script_args.eval_trajectories:
        valid = examples([resolve_expert_path(p) for p in script_args.eval_trajectories], "valid")
        valid = _subset(valid, script_args.max_eval_examples, seed)
    probe = _subset(train, script_args.max_eval_examples, seed + 1)
    return SFTData(train, valid, probe, lengths)


def _balanced(kept_and_report, script_args: SFTScriptArguments, seed: int, split: str, lengths: dict):
    """The length-filtered split with at most ``max_empty_per_manager`` no-change examples per
    manager (``memgym.training.sft_segments.cap_empty``); records the length report and the drops."""
    from memgym.training.sft_segments import cap_empty

    ds, rep = kept_and_report
    lengths[split] = rep.to_json()
    ds, dropped = cap_empty(ds, script_args.max_empty_per_manager, seed)
    if script_args.max_empty_per_manager is not None:
        lengths[split]["empty_dropped"] = dropped
        lengths[split]["used"] = len(ds)
    return ds


def _trainer_columns(ds):
    return ds.select_columns(["prompt", "completion"]) if ds is not None else None


def build_trainer(script_args: SFTScriptArguments, training_args, data: SFTData, policy, callbacks=None):
    """A ``trl.SFTTrainer`` over ``data.train`` with eval sets ``{"train": probe, "valid":
    valid}`` (metrics ``eval_train_loss``, ``eval_valid_loss``), the policy's LoRA config
    (or none: full fine-tuning / continued adapter) and ``callbacks`` (``TrainerCallback``s)."""
    from trl import SFTTrainer

    evals = {"train": _trainer_columns(data.train_probe)}
    if data.valid is not None:
        evals["valid"] = _trainer_columns(data.valid)
    training_args.prediction_loss_only = True  # never accumulate (tokens x vocab) logits in eval
    return bind_memory_eval(SFTTrainer(
        model=policy.model, args=training_args, train_dataset=_trainer_columns(data.train), eval_dataset=evals,
        processing_class=policy.tokenizer, peft_config=policy.peft_config, callbacks=callbacks))


def _losses(metrics: dict) -> dict:
    return {k[len("eval_"):]: float(v) for k, v in metrics.items() if k.endswith("_loss") and k.startswith("eval_")}


def _first_eval_losses(log_history: list[dict]) -> dict:
    """The first logged value of each eval loss (one log entry per eval split)."""
    first: dict = {}
    for h in log_history:
        for k, v in _losses(h).items():
            first.setdefault(k, v)
    return first


def plot_losses(log_history: list[dict], path: Path) -> None:
    """Write ``loss.png``: the training loss per logged step, and the eval losses (train probe
    and validation) at each evaluation, x = optimizer step."""
    from memgym.rewards.scoring.report import pyplot, save_figure

    fig, ax = pyplot().subplots(figsize=(6.4, 4.0))
    tr = [(h["step"], h["loss"]) for h in log_history if "loss" in h and "step" in h]
    if tr:
        ax.plot(*zip(*tr), label="train loss (per step)", color="tab:blue", alpha=0.7)
    for key, colour, name in (("eval_train_loss", "tab:green", "eval loss on train split"),
                              ("eval_valid_loss", "tab:red", "eval loss on validation split")):
        pts = [(h["step"], h[key]) for h in log_history if key in h and "step" in h]
        if pts:
            ax.plot(*zip(*pts), marker="o", linestyle="--", color=colour, label=name)
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("cross-entropy (nats / completion token)")
    ax.set_title("memgym SFT")
    ax.grid(alpha=0.3)
    ax.legend()
    save_figure(fig, path, dpi=110)


def write_report(out: Path, metrics: dict) -> None:
    """Write ``report.md`` (a table of the losses before/after, the run's facts and its run card)."""
    from memgym.llm.runcard import card_markdown

    def f(x):
        return "-" if x is None else f"{x:.4f}"

    lines = [
        "# memgym SFT report", "",
        f"- model: `{metrics['model']}` ({'LoRA' if metrics['use_peft'] else 'full fine-tuning'})",
        f"- train: {', '.join(metrics['train_trajectories'])} ({metrics['examples']['train']} examples used of "
        f"{metrics['lengths']['train']['kept']} within max_length)",
        f"- validation: {', '.join(metrics['eval_trajectories']) or '-'} ({metrics['examples']['valid']} examples "
        f"used of {metrics['lengths'].get('valid', {}).get('kept', 0)} within max_length)",
        f"- max_length {metrics['max_length']} tokens; over-long examples dropped: "
        f"train {metrics['lengths']['train']['dropped']}, "
        f"validation {metrics['lengths'].get('valid', {}).get('dropped', '-')}",
        f"- steps {metrics['global_step']}, wall {metrics['wall_s']:.0f} s", "",
        "| loss (nats/token) | before | after |", "|---|---|---|",
        f"| train split (probe of {metrics['examples']['train_probe']}) | {f(metrics['train_loss_start'])} | "
        f"{f(metrics['train_loss_end'])} |",
        f"| validation split | {f(metrics['eval_loss_start'])} | {f(metrics['eval_loss_end'])} |", "",
        f"Mean training loss over the run: {f(metrics['train_loss'])}.", "",
        "![loss](loss.png)", "",
        *card_markdown(metrics.get("run_card"), str(out / "run_card.json")),
    ]
    (out / "report.md").write_text("\n".join(lines))


def memory_eval(script_args: SFTScriptArguments, policy) -> list:
    """The in-trainer measurement the ``memory_eval_*`` fields ask for
    (:func:`memgym.training.callbacks.build_memory_eval`; validation rows scored by the session reward
    with the offline answer-recall judge and the counterfactual bank), as a callback list."""
    if not script_args.memory_eval_on():
        return []
    from memgym.llm.embeddings import load_embedder
    from memgym.rewards.session_reward import SessionReward, SessionRewardConfig
    from memgym.training.callbacks import build_memory_eval

    embedder = load_embedder("minilm" if script_args.embedder == "none" else script_args.embedder)
    reward = SessionReward(SessionRewardConfig(judge="answer-recall"), embedder=embedder, tokenizer=policy.tokenizer)
    rows = script_args.validation_rows(policy.tokenizer, embedder, segment_tokens=script_args.segment_tokens)
    return [build_memory_eval(script_args, rows, policy.tokenizer, embedder, reward,
                              segment_tokens=script_args.segment_tokens)]


def run(script_args: SFTScriptArguments, training_args, model_args: PolicyModelConfig | None = None,
        callbacks=None) -> dict:
    """Build data, train, evaluate before and after, save to ``output_dir`` (main process only).
    Returns the ``metrics.json`` dict (``train_loss``, ``eval_loss``, ``*_loss_start`` /
    ``*_loss_end``, counts, timings). ``resume_from_checkpoint``: a dir, or ``true`` / ``last``.
    """
    t0 = time.time()
    policy = load_policy(model_args or PolicyModelConfig())
    with outside_zero3(training_args):  # the embedder is loaded whole on every process
        data = build_data(script_args, policy.tokenizer, training_args.max_length, training_args.seed)
        callbacks = [*(callbacks or []), *memory_eval(script_args, policy)]
    # The "before" losses come from eval_on_start, i.e. inside train() once the model is wrapped:
    # evaluating before train() fails under DeepSpeed ZeRO-2 (HF only allows ZeRO-3 inference).
    training_args.eval_on_start = True
    from memgym.training.callbacks import RunCardCallback

    card = RunCardCallback([script_args, training_args, model_args or PolicyModelConfig()],
                           {"policy": (model_args or PolicyModelConfig()).model_name_or_path,
                            "embedder": script_args.embedder})
    callbacks = [*callbacks, card]
    trainer = build_trainer(script_args, training_args, data, policy, callbacks)
    result = trainer.train(resume_from_checkpoint=resume_arg(training_args.resume_from_checkpoint))
    start = _first_eval_losses(trainer.state.log_history)
    end = _losses(trainer.evaluate())
    out = Path(training_args.output_dir)
    trainer.save_model(str(out))
    if trainer.is_world_process_zero():
        trainer.save_state()  # trainer_state.json: log_history with every evaluation's measurement
    metrics = {
        "model": policy.path, "use_peft": bool(policy.peft_config is not None or policy.is_adapter),
        "train_trajectories": list(script_args.train_trajectories),
        "eval_trajectories": list(script_args.eval_trajectories),
        "max_length": training_args.max_length, "segment_tokens": script_args.segment_tokens, "lengths": data.lengths,
        "examples": {"train": len(data.train), "train_probe": len(data.train_probe),
                     "valid": 0 if data.valid is None else len(data.valid)},
        "distributed_type": str(trainer.accelerator.distributed_type.value),
        "num_processes": int(trainer.accelerator.num_processes),
        "global_step": int(trainer.state.global_step),
        "train_loss": float(result.training_loss),
        "train_loss_start": start.get("train_loss"), "train_loss_end": end.get("train_loss"),
        "eval_loss_start": start.get("valid_loss"), "eval_loss_end": end.get("valid_loss"),
        "eval_loss": end.get("valid_loss"),
        "train_runtime_s": float(result.metrics.get("train_runtime", 0.0)),
        "wall_s": time.time() - t0,
        "log_history": trainer.state.log_history,
        "run_card": card.card,
    }
    metrics["is_main_process"] = bool(trainer.is_world_process_zero())
    if metrics["is_main_process"]:
        policy.tokenizer.save_pretrained(str(out))
        (out / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        plot_losses(trainer.state.log_history, out / "loss.png")
        write_report(out, metrics)
    return metrics


def main(argv: list[str] | None = None) -> int:
    """``python -m memgym.training.sft`` (what ``memgym launch`` runs in each process): parse, then
    :func:`train_and_report`. A user error is one stderr line and exit status 2 or 1
    (:func:`memgym.llm.errors.report_errors`)."""
    from memgym.llm.errors import report_errors

    return report_errors(PROG, lambda: train_and_report(*parse_args(argv)))


def train_and_report(script_args, training_args, model_args) -> int:
    """Run :func:`run` and print the summary lines; returns 0."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    metrics = run(script_args, training_args, model_args)
    if not metrics["is_main_process"]:
        return 0

    def f(x):
        return "-" if x is None else f"{x:.4f}"

    print(f"\n{PROG}: {metrics['global_step']} steps on {metrics['examples']['train']} examples, "
          f"wall {metrics['wall_s']:.0f} s")
    print(f"  train split loss: {f(metrics['train_loss_start'])} -> {f(metrics['train_loss_end'])}")
    print(f"  validation loss:  {f(metrics['eval_loss_start'])} -> {f(metrics['eval_loss_end'])}")
    print(f"  outputs: {training_args.output_dir}/ (model, metrics.json, loss.png, report.md)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
