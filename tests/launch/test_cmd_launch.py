"""``memgym launch`` / ``memgym train`` wiring, the accelerate configs, and real multi-process
runs: 2-process CPU DDP (gloo) and 1-process DeepSpeed ZeRO-2, each a few SFT steps of the tiny
model through ``accelerate launch`` in a subprocess."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from memgym.launch.cli import main as cli_main
from memgym.launch.cmd_launch import LaunchError, available_configs, build_command
from tests.helpers import memgym_launch

REPO = Path(__file__).resolve().parents[2]
ACC = REPO / "launch" / "accelerate"
CONFIGS = ["cpu_ddp", "cpu_deepspeed_zero2", "cpu_deepspeed_zero3", "deepspeed_zero2", "deepspeed_zero3", "multi_gpu",
           "single_gpu"]


def test_dry_run_prints_the_exact_command(capsys, monkeypatch):
    monkeypatch.chdir(REPO)
    rc = cli_main(["launch", "--accelerate-config", "multi_gpu", "--num-processes", "7", "--dry-run",
                   "train", "adrpo", "--config", "launch/recipes/adrpo_qwen3_4b_server.yaml", "--max_steps", "10"])
    assert rc == 0
    assert capsys.readouterr().out == (
        "accelerate launch --config_file launch/accelerate/multi_gpu.yaml --num_processes 7 -m memgym.training.adrpo "
        "--config launch/recipes/adrpo_qwen3_4b_server.yaml --max_steps 10\n")
    rc = cli_main(["launch", "--accelerate-config", "cpu_ddp", "--main-process-port", "29601", "--dry-run",
                   "train", "sft", "--config", "launch/recipes/sft_cpu.yaml", "--output_dir", "runs/my run"])
    assert rc == 0
    assert capsys.readouterr().out == (
        "accelerate launch --config_file launch/accelerate/cpu_ddp.yaml --main_process_port 29601 -m memgym.training.sft "
        "--config launch/recipes/sft_cpu.yaml --output_dir 'runs/my run'\n")


def test_bad_requests_fail_clearly(capsys):
    assert cli_main(["launch", "--accelerate-config", "zero9", "--dry-run", "train", "sft"]) == 2
    err = capsys.readouterr().err
    assert "unknown accelerate config 'zero9'" in err and ", ".join(CONFIGS) in err
    assert cli_main(["launch", "--accelerate-config", "cpu_ddp", "--dry-run", "train", "dpo"]) == 2
    assert "unknown stage 'dpo'" in capsys.readouterr().err
    assert cli_main(["launch", "--accelerate-config", "cpu_ddp", "--dry-run", "eval", "x"]) == 2
    assert "expected `train <stage> [args]`" in capsys.readouterr().err
    with pytest.raises(LaunchError, match="--num-processes must be >= 1"):
        build_command("cpu_ddp", ["train", "sft"], num_processes=0)
    assert build_command(str(ACC / "single_gpu.yaml"), ["train", "sft"])[3].endswith("single_gpu.yaml")


def test_accelerate_configs_load():
    from accelerate.commands.config.config_args import load_config_from_file

    assert available_configs() == CONFIGS
    cfg = {n: load_config_from_file(str(ACC / f"{n}.yaml")) for n in CONFIGS}
    got = {n: (c.distributed_type.value, c.num_processes, c.mixed_precision) for n, c in cfg.items()}
    assert got == {"cpu_ddp": ("MULTI_GPU", 2, "no"), "cpu_deepspeed_zero2": ("DEEPSPEED", 1, "no"),
                   "cpu_deepspeed_zero3": ("DEEPSPEED", 2, "no"), "deepspeed_zero2": ("DEEPSPEED", 8, "bf16"), "deepspeed_zero3": ("DEEPSPEED", 8, "bf16"),
                   "multi_gpu": ("MULTI_GPU", 8, "bf16"), "single_gpu": ("NO", 1, "bf16")}
    for n, stage in (("deepspeed_zero2", 2), ("deepspeed_zero3", 3), ("cpu_deepspeed_zero2", 2),
                     ("cpu_deepspeed_zero3", 3)):
        ds = cfg[n].deepspeed_config
        assert (ds["zero_stage"], ds["offload_optimizer_device"], ds["offload_param_device"],
                ds["gradient_clipping"]) == (stage, "none", "none", 1.0)
    # the CPU ZeRO-3 config shards, initialises and saves as the GPU one does
    gpu, cpu = (yaml.safe_load((ACC / f"{n}.yaml").read_text()) for n in ("deepspeed_zero3", "cpu_deepspeed_zero3"))
    assert cpu["deepspeed_config"] == gpu["deepspeed_config"]
    for n in CONFIGS:
        assert yaml.safe_load((ACC / f"{n}.yaml").read_text())["num_machines"] == 1


def test_train_help_lists_fields(capsys):
    with pytest.raises(SystemExit) as e:  # `memgym train sft --help` reaches TrlParser's help
        cli_main(["train", "sft", "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert "usage: memgym train sft" in out
    assert "--lora_target_modules" in out and "--max_length" in out and "--train_trajectories" in out


def _launch(config: str, tiny_model_dir: Path, traj: Path, out: Path, extra: list[str], threads: str,
            env: dict | None = None) -> dict:
    memgym_launch(config, "sft", [
        "--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
        "--train_trajectories", str(traj), "--eval_trajectories", str(traj),
        "--managers", "core", "procedural", "--embedder", "none", "--max_length", "1000",
        "--max_eval_examples", "1", "--per_device_train_batch_size", "1", "--per_device_eval_batch_size", "1",
        "--activation_checkpointing", "false", "--logging_steps", "1", "--save_strategy", "no",
        "--report_to", "none", "--disable_tqdm", "true", *extra], threads=threads, env=env)
    return json.loads((out / "metrics.json").read_text())


def test_cpu_ddp_two_processes(tiny_model_dir, session1_file, tmp_path):
    """2 gloo processes, 2 examples (core 955, procedural 871 tokens), batch 1 per process: one
    optimizer step covers both examples, so 2 steps are 2 epochs (1 process: 1 epoch)."""
    m = _launch("cpu_ddp", tiny_model_dir, session1_file, tmp_path / "ddp", ["--max_steps", "2"], threads="1")
    assert (m["distributed_type"], m["num_processes"]) == ("MULTI_CPU", 2)
    assert m["global_step"] == 2 and m["examples"]["train"] == 2
    assert [h["epoch"] for h in m["log_history"] if "loss" in h] == [1.0, 2.0]
    assert (tmp_path / "ddp" / "adapter_model.safetensors").is_file()


def test_deepspeed_zero2_one_process(tiny_model_dir, session1_file, tmp_path):
    """One ZeRO-2 optimizer step (2 micro-batches) under DeepSpeed's engine, without DeepSpeed's
    shared-memory comm op (tests/launch/no_shm_op: one process has no peer; saves its ~3 min C++ build)."""
    pytest.importorskip("deepspeed", reason="deepspeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)")
    no_shm = os.pathsep.join(filter(None, [str(Path(__file__).parent / "no_shm_op"), os.environ.get("PYTHONPATH")]))
    m = _launch("cpu_deepspeed_zero2", tiny_model_dir, session1_file, tmp_path / "ds",
                ["--max_steps", "1", "--gradient_accumulation_steps", "2"], threads="2", env={"PYTHONPATH": no_shm})
    assert (m["distributed_type"], m["num_processes"]) == ("DEEPSPEED", 1)
    assert m["global_step"] == 1
    assert [h["epoch"] for h in m["log_history"] if "loss" in h] == [1.0]
    assert (tmp_path / "ds" / "adapter_model.safetensors").is_file()


def test_gpu_check_dry_run_builds_every_stage(tmp_path):
    """scripts/experiments/gpu_check/gpu_check.sh --dry-run: the three stages' configs come from the real recipe
    parsers (no model, no GPU) and the ZeRO-2 stage is one process under deepspeed_zero2."""
    proc = subprocess.run(["bash", str(REPO / "scripts" / "experiments" / "gpu_check" / "gpu_check.sh"), "--dry-run", "--out", str(tmp_path)],
                          env={**os.environ, "PYTHON": sys.executable}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    plan = json.loads(proc.stdout)
    assert (plan["sft"]["max_steps"], plan["sft"]["use_peft"], plan["sft"]["lora_r"]) == (20, True, 16)
    assert (plan["adrpo"]["max_steps"], plan["adrpo"]["num_generations"], plan["adrpo"]["use_vllm"],
            plan["adrpo"]["embedder"]) == (2, 4, False, "hash:64")
    cmd = plan["zero2"]["command"]
    assert "deepspeed_zero2.yaml --num_processes 1" in cmd and "--stage sft --steps 1" in cmd
    bad = subprocess.run(["bash", str(REPO / "scripts" / "experiments" / "gpu_check" / "gpu_check.sh"), "--nope"], capture_output=True, text=True)
    assert bad.returncode == 2 and "unknown argument --nope" in bad.stderr


def test_eval_and_evolve_recipes_parse_without_importing_training():
    """``memgym eval`` / ``program eval`` / ``evolve`` parse their recipes through the command
    registry (:mod:`memgym.launch.registry`) without loading ``training/``."""
    code = (
        "import sys\n"
        "from memgym.launch.cli import build_parser\n"
        "from memgym.launch.registry import parse\n"
        "from memgym.llm.recipe import recipe_configs\n"
        "for cmd, recipe in ((['eval'], 'demo_locomo'), (['program', 'eval'], 'program_locomo'),\n"
        "                    (['evolve'], 'demo_evolve')):\n"
        "    (cfg,) = recipe_configs(parse(build_parser(), [*cmd, '--config', f'launch/recipes/{recipe}.yaml']))\n"
        "print(sorted(m for m in sys.modules if m == 'training' or m.startswith('training.')))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "[]"


def test_launch_parses_the_trainer_arguments_once_before_any_process(capsys, monkeypatch):
    """``memgym launch`` parses the trainer's arguments with the parser each process runs: a bad
    field is one line and exit status 2, and no command is printed or run; its errors reach the
    one mapping (``memgym --debug`` re-raises them)."""
    monkeypatch.chdir(REPO)
    rc = cli_main(["launch", "--accelerate-config", "cpu_ddp", "--dry-run", "train", "sft", "--config",
                   "launch/recipes/sft_cpu.yaml", "--max_stepz", "3"])
    out, err = capsys.readouterr()
    assert rc == 2 and out == ""
    assert err.strip() == ("memgym launch: unknown field(s): --max_stepz (did you mean --max_steps?); --help lists "
                           "every field")
    with pytest.raises(LaunchError, match="unknown accelerate config 'zero9'"):
        cli_main(["--debug", "launch", "--accelerate-config", "zero9", "--dry-run", "train", "sft"])
