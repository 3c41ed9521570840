"""The stages of ``scripts/experiments/gpu_check/gpu_check.sh`` (read its header first): SFT + LoRA of SmolLM2 in bf16,
two ADRPO steps with HF generation, and one accelerate + DeepSpeed ZeRO-2 step; each reports
tokens/s and peak GPU memory.

Stages (``--stage``):
- ``sft``: TRL ``SFTTrainer`` via :mod:`memgym.training.sft` (the ``sft_cpu`` recipe's data and LoRA,
  bf16 weights and autocast), ``--steps`` optimizer steps of one example each. Tokens/s is
  TRL's ``num_tokens`` (prompt + completion tokens trained on) over ``train_runtime``.
- ``adrpo``: :mod:`memgym.training.adrpo` (the ``adrpo_cpu`` recipe: 4 generations of up to 96 tokens
  per prompt, HF ``generate``, no vLLM), ``--steps`` steps. The reward's retrieval uses the
  model-free hash embedder, so no sentence-transformers model is needed: this checks the
  trainer on a GPU, not reward quality. Tokens/s is TRL's ``num_tokens`` over ``train_runtime``.
- ``zero2``: runs ``accelerate launch --config_file launch/accelerate/deepspeed_zero2.yaml
  --num_processes 1`` on this file's ``sft`` stage for one step and reads its JSON back.
- ``vllm``: the tests marked ``vllm`` (tests/vllm/: ``memgym serve --engine vllm``, the ``vllm:`` and
  ``openai:`` backends, structured outputs, ``memgym eval`` / synth / annotate, ADRPO with
  ``use_vllm`` colocated and against the server), the checks ``make test-vllm`` runs on CPU; on a
  GPU the server-mode ADRPO test requires TRL's NCCL weight sync to run and the served policy to
  change. Needs vLLM (``pip install 'memgym[gpu]'`` or a venv like ``make vllm``'s); its pass /
  fail counts come from pytest's JUnit XML.
- ``all`` (default): sft, adrpo, zero2, then vllm when vLLM is importable.

Peak GPU memory is ``torch.cuda.max_memory_allocated`` in MiB since the stage started (the
zero2 child measures its own). ``--dry-run`` builds every stage's configuration through the
real recipe parsers and prints the plan and the accelerate command without loading a model
or needing a GPU (on a machine without CUDA the parsers apply the CPU defaults).

Writes ``<out>/gpu_check.json`` and prints a Markdown table. Exit 0 when every stage ran, 1
when a stage failed (its error is in the table and the JSON), 2 for bad arguments.
"""
from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
import traceback
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
RECIPES = REPO / "launch" / "recipes"
ZERO2 = REPO / "launch" / "accelerate" / "deepspeed_zero2.yaml"
GPU_FLAGS = ["--bf16", "true", "--use_cpu", "false", "--dtype", "bfloat16"]
COMMON = ["--report_to", "none", "--save_strategy", "no", "--logging_steps", "1", "--disable_tqdm", "true"]


def sft_argv(model: str, out: Path, steps: int, gpu: bool) -> list[str]:
    """Arguments of :func:`memgym.training.sft.parse_args` for ``steps`` one-example SFT steps."""
    return (["--config", str(RECIPES / "sft_cpu.yaml"), "--model_name_or_path", model, "--output_dir", str(out),
             "--max_steps", str(steps), "--max_examples", str(steps), "--embedder", "none",
             "--eval_strategy", "no"] + COMMON + (GPU_FLAGS if gpu else []))


def adrpo_argv(model: str, out: Path, steps: int, gpu: bool) -> list[str]:
    """Arguments of :func:`memgym.training.adrpo.parse_args` for ``steps`` ADRPO steps (HF generation)."""
    return (["--config", str(RECIPES / "adrpo_cpu.yaml"), "--model_name_or_path", model, "--output_dir", str(out),
             "--max_steps", str(steps), "--embedder", "hash:64", "--use_vllm", "false"] + COMMON
            + (GPU_FLAGS if gpu else []))


def zero2_command(model: str, out: Path, python: str = sys.executable) -> list[str]:
    """The ``accelerate launch`` command of the ZeRO-2 stage (one process, one SFT step)."""
    return [python, "-m", "accelerate.commands.launch", "--config_file", str(ZERO2), "--num_processes", "1",
            str(Path(__file__).resolve()), "--stage", "sft", "--steps", "1", "--model", model, "--out", str(out),
            "--json", str(out / "zero2_child.json")]


def _tokens_per_s(history: list[dict], runtime_s: float) -> tuple[int, float]:
    tokens = max((int(h["num_tokens"]) for h in history if "num_tokens" in h), default=0)
    return tokens, (tokens / runtime_s if runtime_s > 0 else 0.0)


def _peak_mib() -> float:
    import torch

    return torch.cuda.max_memory_allocated() / 2 ** 20 if torch.cuda.is_available() else 0.0


def _reset_peak() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def run_sft(model: str, out: Path, steps: int) -> dict:
    from memgym.training.common import load_policy
    from memgym.training.sft import build_data, build_trainer, parse_args

    _reset_peak()
    script_args, training_args, model_args = parse_args(sft_argv(model, out / "sft", steps, gpu=True))
    policy = load_policy(model_args)
    data = build_data(script_args, policy.tokenizer, training_args.max_length, training_args.seed, progress=False)
    trainer = build_trainer(script_args, training_args, data, policy)
    result = trainer.train()
    runtime = float(result.metrics["train_runtime"])
    tokens, rate = _tokens_per_s(trainer.state.log_history, runtime)
    losses = [round(h["loss"], 4) for h in trainer.state.log_history if "loss" in h]
    return {"steps": int(trainer.state.global_step), "tokens": tokens, "train_runtime_s": round(runtime, 2),
            "tokens_per_s": round(rate, 1), "peak_gpu_mib": round(_peak_mib(), 1),
            "distributed_type": str(trainer.accelerator.distributed_type.value),
            "loss_first_last": [losses[0], losses[-1]] if losses else []}


def run_adrpo(model: str, out: Path, steps: int) -> dict:
    from memgym.training.adrpo import build_trainer, parse_args

    _reset_peak()
    trainer = build_trainer(*parse_args(adrpo_argv(model, out / "adrpo", steps, gpu=True)))
    result = trainer.train()
    runtime = float(result.metrics["train_runtime"])
    tokens, rate = _tokens_per_s(trainer.state.log_history, runtime)
    rewards = [round(h["reward"], 4) for h in trainer.state.log_history if "reward" in h]
    return {"steps": int(trainer.state.global_step), "tokens": tokens, "train_runtime_s": round(runtime, 2),
            "tokens_per_s": round(rate, 1), "peak_gpu_mib": round(_peak_mib(), 1), "reward_per_step": rewards}


def run_zero2(model: str, out: Path) -> dict:
    cmd = zero2_command(model, out)
    print("+ " + shlex.join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    child = out / "zero2_child.json"
    if proc.returncode != 0 or not child.is_file():
        raise RuntimeError(f"accelerate launch exited {proc.returncode} (see its output above)")
    rep = json.loads(child.read_text())["stages"]["sft"]
    if "error" in rep:
        raise RuntimeError(f"the ZeRO-2 child failed: {rep['error']}")
    if rep.get("distributed_type") != "DEEPSPEED":
        raise RuntimeError(f"the child ran under {rep.get('distributed_type')}, not DEEPSPEED")
    return rep


def run_vllm_lane(out: Path) -> dict:
    """``pytest -m vllm tests/vllm`` in this Python; counts from its JUnit XML."""
    import xml.etree.ElementTree as ET

    xml = out / "vllm_tests.xml"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "vllm", "-rA", "--durations=0",
           f"--junitxml={xml}", "tests/vllm"]
    print("+ " + shlex.join(cmd), flush=True)
    proc = subprocess.run(cmd, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    if not xml.is_file():
        raise RuntimeError(f"pytest exited {proc.returncode} without a report")
    suite = ET.parse(xml).getroot()
    suite = suite if suite.tag == "testsuite" else suite.find("testsuite")
    n = {k: int(suite.get(k, 0)) for k in ("tests", "failures", "errors", "skipped")}
    if proc.returncode != 0:
        raise RuntimeError(f"pytest exited {proc.returncode}: {n}")
    return {"steps": n["tests"], "passed": n["tests"] - n["failures"] - n["errors"] - n["skipped"], **n}


def dry_run(model: str, out: Path, steps: int, adrpo_steps: int) -> dict:
    """Parse every stage's configuration (no model, no GPU) and return the plan."""
    import torch

    from memgym.training.adrpo import parse_args as adrpo_parse
    from memgym.training.sft import parse_args as sft_parse

    gpu = torch.cuda.is_available()
    s, t, m = sft_parse(sft_argv(model, out / "sft", steps, gpu))
    sa, _, a, _ = adrpo_parse(adrpo_argv(model, out / "adrpo", adrpo_steps, gpu))
    return {
        "cuda": gpu,
        "sft": {"max_steps": t.max_steps, "max_examples": s.max_examples, "bf16": t.bf16, "dtype": m.dtype,
                "use_peft": m.use_peft, "lora_r": m.lora_r, "max_length": t.max_length},
        "adrpo": {"max_steps": a.max_steps, "num_generations": a.num_generations, "use_vllm": a.use_vllm,
                  "max_completion_length": a.max_completion_length, "loss_type": a.loss_type, "bf16": a.bf16,
                  "embedder": sa.embedder, "weighting": a.weighting},
        "zero2": {"command": shlex.join(zero2_command(model, out))},
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check.py", description=__doc__.split("\n\n")[0])
    p.add_argument("--stage", choices=("all", "sft", "adrpo", "zero2", "vllm"), default="all")
    p.add_argument("--model", default="smollm2", help="SmolLM2 dir, or 'smollm2' (memgym models prepare)")
    p.add_argument("--out", default="runs/gpu_check", help="output dir")
    p.add_argument("--steps", type=int, default=20, help="SFT steps (default 20)")
    p.add_argument("--adrpo-steps", type=int, default=2, help="ADRPO steps (default 2)")
    p.add_argument("--json", default=None, help="where to write the report (default <out>/gpu_check.json)")
    p.add_argument("--dry-run", action="store_true", help="parse every stage's config and print the plan only")
    args = p.parse_args(argv)
    if args.steps < 1 or args.adrpo_steps < 1:
        p.error("--steps and --adrpo-steps must be >= 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    report_path = Path(args.json) if args.json else out / "gpu_check.json"
    if args.dry_run:
        plan = dry_run(args.model, out, args.steps, args.adrpo_steps)
        print(json.dumps(plan, indent=2))
        return 0
    import torch

    if not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device (use --dry-run to check the plan on CPU)", file=sys.stderr)
        return 2
    import importlib.util

    stages = ([*("sft", "adrpo", "zero2"), *(("vllm",) if importlib.util.find_spec("vllm") else ())]
              if args.stage == "all" else [args.stage])
    runners = {"sft": lambda: run_sft(args.model, out, args.steps),
               "adrpo": lambda: run_adrpo(args.model, out, args.adrpo_steps),
               "zero2": lambda: run_zero2(args.model, out),
               "vllm": lambda: run_vllm_lane(out)}
    report = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "stages": {}}
    for name in stages:
        t0 = time.time()
        try:
            report["stages"][name] = runners[name]()
        except Exception as e:  # noqa: BLE001 - one stage's failure is reported, the others still run
            traceback.print_exc()
            report["stages"][name] = {"error": f"{type(e).__name__}: {e}"}
        report["stages"][name]["wall_s"] = round(time.time() - t0, 1)
        report_path.write_text(json.dumps(report, indent=2) + "\n")
    print(f"\n{report['device']}, torch {report['torch']}\n")
    print("| stage | steps | tokens | tokens/s | peak GPU MiB | wall s |\n|---|---|---|---|---|---|")
    for name, r in report["stages"].items():
        if "error" in r:
            print(f"| {name} | failed: {r['error'][:80]} | | | | {r['wall_s']} |")
        else:
            print(f"| {name} | {r['steps']} | {r.get('tokens', '')} | {r.get('tokens_per_s', '')} | "
                  f"{r.get('peak_gpu_mib', '')} | {r['wall_s']} |")
    print(f"\nreport: {report_path}")
    return 1 if any("error" in r for r in report["stages"].values()) else 0


if __name__ == "__main__":
    sys.exit(main())
