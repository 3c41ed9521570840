"""``memgym bench train``: training throughput, each number a ratio measured in the same run.

1. ADRPO step time against a stock TRL ``GRPOTrainer`` on the same policy (same LoRA init),
   the same rows and the same session reward; the two trainers alternate one optimizer step at
   a time (A B, B A, ...) so machine load hits both alike, and each step starts from the same
   RNG seed with learning rate 0, so both generate the same completions and do the same work
   apart from ADRPO's own (advantages x w(m), breakdown logging; the loss is TRL's). The time is TRL's
   ``step_time`` metric: generation + reward + loss + backward of one optimizer step.
2. SFT tokens/s of TRL's ``SFTTrainer`` (the ``sft_cpu`` recipe's data and LoRA) against a
   plain PyTorch floor: the same model, the same examples (prompt masked), ``loss.backward()``
   and ``AdamW.step()`` in a bare loop. Alternated the same way.
3. Peak RSS of this process (``resource.getrusage``, MiB) after each phase; the value is a
   high-water mark, so later phases include earlier ones.

Prints a Markdown table, then one JSON line.
"""
from __future__ import annotations

import json
import os
import resource
import sys
import time
from pathlib import Path


def peak_rss_mib() -> float:
    """High-water resident set size of this process, MiB (Linux ``ru_maxrss`` is in KiB)."""
    r = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return r / 1024.0 if sys.platform != "darwin" else r / (1024.0 * 1024.0)


def _grpo_pair(args, tmp: Path):
    """(stock GRPOTrainer, ADRPOTrainer) over the same rows, reward and policy weights."""
    from trl import GRPOConfig, GRPOTrainer

    from rewards.samples import build_reward_samples
    from rewards.session_reward import SessionReward
    from llm.embeddings import load_embedder
    from training.adrpo import trajectory_paths
    from training.adrpo_config import ADRPOConfig
    from training.adrpo_data import build_dataset, sample_table, select_samples
    from training.adrpo_trainer import ADRPOTrainer, SessionRewardFunction
    from training.common import PolicyModelConfig, load_policy

    common = dict(use_cpu=not _cuda(), bf16=_cuda(), report_to="none", activation_checkpointing=False,
                  num_generations=args.num_generations, per_device_train_batch_size=args.micro_batch,
                  gradient_accumulation_steps=args.num_generations // args.micro_batch,
                  max_completion_length=args.max_completion_length, max_steps=1, logging_steps=1,
                  save_strategy="no", learning_rate=0.0, beta=0.02, loss_type="dapo", temperature=0.8, top_p=0.9,
                  seed=0, disable_tqdm=True)
    policies = [load_policy(PolicyModelConfig(model_name_or_path=args.model, lora_dropout=0.0)) for _ in range(2)]
    tok = policies[0].tokenizer
    embedder = load_embedder(args.embedder)
    samples = build_reward_samples(trajectory_paths([args.trajectory]), embedder=embedder)
    samples = select_samples(samples, sessions=[1], max_prompt_tokens=args.max_prompt_tokens, tokenizer=tok)
    reward_args = ADRPOConfig(output_dir=str(tmp / "adrpo"), embedder=args.embedder, **common)
    stock = GRPOTrainer(policies[0].model, args=GRPOConfig(output_dir=str(tmp / "grpo"), **common),
                        reward_funcs=[SessionRewardFunction(
                            SessionReward(reward_args.reward_config(), embedder=embedder, tokenizer=tok),
                            sample_table(samples), args.num_generations)],
                        train_dataset=build_dataset(samples), processing_class=tok,
                        peft_config=policies[0].peft_config)
    adrpo = ADRPOTrainer(policies[1].model, args=reward_args, samples=samples,
                         reward=SessionReward(reward_args.reward_config(), embedder=embedder, tokenizer=tok),
                         processing_class=policies[1].tokenizer, peft_config=policies[1].peft_config)
    return stock, adrpo, len(samples)


def _cuda() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _one_step(trainer, seed: int) -> float:
    """Run one optimizer step from RNG seed ``seed``; return TRL's ``step_time`` of it, seconds."""
    from transformers import set_seed

    set_seed(seed)
    trainer.train()
    logged = [h for h in trainer.state.log_history if "step_time" in h]
    if not logged:
        raise RuntimeError("the trainer logged no step_time")
    return float(logged[-1]["step_time"]), float(logged[-1]["num_tokens"])


def bench_grpo(args, tmp: Path) -> dict:
    """ADRPO vs stock GRPO step time, ``args.reps`` alternating pairs."""
    from tqdm.auto import tqdm

    stock, adrpo, n_rows = _grpo_pair(args, tmp)
    t_stock, t_adrpo, n_stock, n_adrpo = [], [], [], []
    for r in tqdm(range(args.reps), desc="grpo vs adrpo", unit="pair"):
        order = [(stock, t_stock, n_stock), (adrpo, t_adrpo, n_adrpo)]
        for trainer, times, tokens in (order if r % 2 == 0 else order[::-1]):
            t, n = _one_step(trainer, seed=1000 + r)
            times.append(t)
            tokens.append(n)
    return {"rows": n_rows, "completions_per_step": args.num_generations, "reps": args.reps,
            "grpo_step_s": [round(x, 3) for x in t_stock], "adrpo_step_s": [round(x, 3) for x in t_adrpo],
            "grpo_tokens": n_stock, "adrpo_tokens": n_adrpo,  # prompt + completion tokens of each step
            "grpo_mean_s": round(sum(t_stock) / len(t_stock), 3), "adrpo_mean_s": round(sum(t_adrpo) / len(t_adrpo), 3),
            "adrpo_over_grpo": round(sum(t_adrpo) / sum(t_stock), 3), "peak_rss_mib": round(peak_rss_mib(), 1)}


def _sft_setup(args, tmp: Path):
    from training.common import load_policy
    from training.sft import build_data, build_trainer, parse_args

    argv = ["--config", str(Path(__file__).resolve().parents[1] / "recipes" / "sft_cpu.yaml"), "--output_dir", str(tmp / "sft"),
            "--max_steps", str(args.sft_steps), "--max_length", str(args.sft_max_length),
            "--max_examples", str(args.sft_steps), "--embedder", "minilm" if args.embedder == "minilm" else "none",
            "--model_name_or_path", args.model, "--disable_tqdm", "true"]
    script_args, training_args, model_args = parse_args(argv + ["--lora_dropout", "0.0"])
    policy = load_policy(model_args)
    data = build_data(script_args, policy.tokenizer, training_args.max_length, training_args.seed, progress=False)
    return script_args, training_args, model_args, data, policy, build_trainer


def _floor_loop(policy, rows, lr: float) -> tuple[int, float]:
    """Plain PyTorch: forward with prompt-masked labels, backward, AdamW step, per example.
    Returns (tokens, seconds)."""
    import torch
    from peft import get_peft_model

    model = get_peft_model(policy.model, policy.peft_config) if policy.peft_config is not None else policy.model
    model.train()
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=lr)
    tok = policy.tokenizer
    batches = []
    for row in rows:
        prompt = tok.apply_chat_template(row["prompt"], add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]
        full = tok.apply_chat_template(row["prompt"] + row["completion"], tokenize=True,
                                       return_dict=True)["input_ids"]
        ids = torch.tensor([full])
        labels = ids.clone()
        labels[0, : len(prompt)] = -100
        batches.append((ids, labels))
    tokens = sum(b[0].numel() for b in batches)
    t = time.perf_counter()
    for ids, labels in batches:
        loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    return tokens, time.perf_counter() - t


def bench_sft(args, tmp: Path) -> dict:
    """SFTTrainer tokens/s vs the plain loop over the same examples, alternating."""
    from tqdm.auto import tqdm

    from training.common import load_policy

    script_args, training_args, model_args, data, policy, build_trainer = _sft_setup(args, tmp)
    rows = [data.train[i] for i in range(min(args.sft_steps, len(data.train)))]
    trainer = build_trainer(script_args, training_args, data, policy)
    floor_policy = load_policy(model_args)
    sft_rate, floor_rate, sft_tokens, floor_tokens = [], [], 0, 0
    seen = [0]  # TRL's num_tokens keeps counting across train() calls on one trainer
    for r in tqdm(range(args.reps), desc="sft vs floor", unit="pair"):
        def run_sft():
            result = trainer.train()
            toks = [h["num_tokens"] for h in trainer.state.log_history if "num_tokens" in h]
            total = int(toks[-1]) if toks else 0
            n, seen[0] = total - seen[0], total
            sft_rate.append(n / float(result.metrics["train_runtime"]))
            return n

        def run_floor():
            n, s = _floor_loop(floor_policy, rows, training_args.learning_rate)
            floor_rate.append(n / s)
            return n

        for fn in ((run_sft, run_floor) if r % 2 == 0 else (run_floor, run_sft)):
            n = fn()
            if fn is run_sft:
                sft_tokens = n
            else:
                floor_tokens = n
    mean = lambda xs: sum(xs) / len(xs)  # noqa: E731
    return {"examples": len(rows), "steps": args.sft_steps, "tokens_per_run": sft_tokens,
            "floor_tokens_per_run": floor_tokens,
            "sft_tokens_per_s": round(mean(sft_rate), 1), "floor_tokens_per_s": round(mean(floor_rate), 1),
            "sft_over_floor": round(mean(sft_rate) / mean(floor_rate), 3), "peak_rss_mib": round(peak_rss_mib(), 1)}


def _run(args) -> int:
    import tempfile

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    if args.num_generations % args.micro_batch:
        print("memgym bench train: --num-generations must be a multiple of --micro-batch", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="memgym_bench_train_") as d:
        tmp = Path(d)
        grpo = bench_grpo(args, tmp) if not args.skip_grpo else None
        sft = bench_sft(args, tmp) if not args.skip_sft else None
    print(f"\nmodel {args.model}, CPU threads {os.cpu_count()}, load average {os.getloadavg()[0]:.1f}\n")
    print("| measure | ours | reference | ratio | peak RSS MiB |")
    print("|---|---|---|---|---|")
    if grpo:
        print(f"| step time, {grpo['completions_per_step']} completions (s) | ADRPO {grpo['adrpo_mean_s']:.2f} "
              f"| GRPOTrainer {grpo['grpo_mean_s']:.2f} | {grpo['adrpo_over_grpo']:.2f}x | {grpo['peak_rss_mib']:.0f} |")
    if sft:
        print(f"| SFT tokens/s ({sft['tokens_per_run']} tokens/run) | SFTTrainer {sft['sft_tokens_per_s']:.1f} "
              f"| plain loop {sft['floor_tokens_per_s']:.1f} | {sft['sft_over_floor']:.2f}x | "
              f"{sft['peak_rss_mib']:.0f} |")
    result = {"model": args.model, "grpo": grpo, "sft": sft}
    print(json.dumps(result))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2) + "\n")
    return 0


def register_bench(sub) -> None:
    """Add ``memgym bench train`` to the ``bench`` sub-command parsers."""
    p = sub.add_parser("train", help="ADRPO vs GRPOTrainer step time, SFT tokens/s vs a plain loop, peak RSS",
                       description="ADRPO step time as a ratio to a stock TRL GRPOTrainer (same model, batch "
                                   "and reward, alternating steps), SFTTrainer tokens/s as a ratio to a plain "
                                   "PyTorch loop on the same examples, and peak RSS. Defaults: the embedded "
                                   "SmolLM2 with LoRA on LoCoMo conv-26 session 1 (CPU: several minutes).")
    p.add_argument("--model", default="smollm2", help="policy: smollm2 or a local model dir (default smollm2)")
    from launch.bench.args import expert_conversation, int_range

    p.add_argument("--trajectory", default="conv-26", type=expert_conversation,
                   help="expert trajectory for the ADRPO rows (default conv-26)")
    p.add_argument("--embedder", default="minilm", choices=["minilm", "hash"], help="retrieval embedder")
    p.add_argument("--reps", type=int_range(1, 1_000_000),
                   default=2, help="alternating pairs of measurements (default 2)")
    p.add_argument("--num-generations", type=int_range(1, 1_000_000),
                   default=4, help="completions per prompt = per step (default 4)")
    p.add_argument("--micro-batch", type=int_range(1, 1_000_000),
                   default=1, help="completions per forward/backward (default 1)")
    p.add_argument("--max-completion-length", type=int_range(1, 1_000_000),
                   default=48, help="tokens per completion (default 48)")
    p.add_argument("--max-prompt-tokens", type=int_range(1, 1_000_000),
                   default=900, help="drop rows with longer prompts (default 900)")
    p.add_argument("--sft-steps", type=int_range(1, 1_000_000),
                   default=3, help="SFT steps (= examples) per run (default 3)")
    p.add_argument("--sft-max-length", type=int_range(1, 1_000_000),
                   default=1536, help="SFT example cap, tokens (default 1536)")
    p.add_argument("--skip-grpo", action="store_true", help="skip the ADRPO/GRPO comparison")
    p.add_argument("--skip-sft", action="store_true", help="skip the SFT comparison")
    p.add_argument("--out", default=None, help="also write the JSON here")
    p.set_defaults(func=_run)
