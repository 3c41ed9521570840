"""DeepSpeed ZeRO-3 across two CPU processes (``launch/accelerate/cpu_deepspeed_zero3.yaml``, gloo),
each run through ``memgym launch`` and held against a run it must equal.

- SFT (full fine-tuning of the tiny model, 4 conv-26 session-1 examples, 4 steps = 2 epochs):
  2 processes x batch 1 under ZeRO-3 against 1 process x batch 2 without DeepSpeed. Same global
  batch, seed and data order: accelerate's seeded sampler draws one permutation per epoch and
  hands process p every other batch of 1 of it, so step k trains on the same two examples in both.
- Resume: the ZeRO-3 run's checkpoint-2 (one weight and optimizer shard per process) resumed to
  step 4 equals the uninterrupted run.
- ADRPO (LoRA on the planted tiny policy, 2 screened rows x 4 completions per step, 2 steps):
  ZeRO-3 against 2-process DDP, and with ``ds3_gather_for_generation`` off. Not against 1 process:
  TRL seeds each process's sampling with ``seed + process_index``
  (``GRPOTrainer.__init__``: ``set_seed(args.seed, device_specific=True)``), so 2 processes draw
  the 8 completions of a step from two random streams and 1 process from one; other completions
  get other rewards, advantages and loss. 2-process DDP draws as ZeRO-3 does.

Every run keeps ``tests/launch/no_shm_op`` on its PYTHONPATH: DeepSpeed's shared-memory op serves
only ``inference_all_reduce`` (tensor-parallel inference), so training's collectives are the same
without it, and a fresh checkout skips its C++ build. ``MEMGYM_CACHE`` starts empty, so the first
ZeRO-3 run's MiniLM embedder runs its model (no cached vectors).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.helpers import memgym_launch

pytest.importorskip("deepspeed", reason="deepspeed is not installed (DS_BUILD_OPS=0 pip install deepspeed)")

TINY_PARAMS = 3_219_776  # 49152 x 64 tied embedding + 2 x 36,992 per layer + 64 final norm
COMMON = ["--report_to", "none", "--disable_tqdm", "true", "--activation_checkpointing", "false",
          "--logging_steps", "1", "--seed", "0"]


@pytest.fixture(scope="module")
def env(tmp_path_factory) -> dict:
    """The runs' extra environment: DeepSpeed without its shm op, and a cache dir of this module
    (its first run embeds with the MiniLM model; the later runs find the vectors cached)."""
    no_shm = os.pathsep.join(filter(None, [str(Path(__file__).parent / "no_shm_op"), os.environ.get("PYTHONPATH")]))
    return {"PYTHONPATH": no_shm, "MEMGYM_CACHE": str(tmp_path_factory.mktemp("cache"))}


def _sft_args(model: Path, traj: Path, out: Path) -> list[str]:
    return ["--model_name_or_path", str(model), "--output_dir", str(out), "--use_peft", "false",
            "--train_trajectories", str(traj), "--eval_trajectories", str(traj), "--embedder", "minilm",
            "--max_length", "1300", "--max_eval_examples", "1", "--per_device_eval_batch_size", "1",
            "--learning_rate", "1e-2", "--max_steps", "4", "--memory_eval_trajectories", "conv-30",
            "--memory_eval_sessions", "1", "--memory_eval_rows", "2", "--memory_eval_max_new_tokens", "10", *COMMON]


def _losses(metrics: dict) -> dict[int, float]:
    return {h["step"]: h["loss"] for h in metrics["log_history"] if "loss" in h}


@pytest.fixture(scope="module")
def sft_zero3(tiny_model_dir, session1_file, tmp_path_factory, env):
    tmp = tmp_path_factory.mktemp("sft_zero3")
    memgym_launch("cpu_deepspeed_zero3", "sft", [
        *_sft_args(tiny_model_dir, session1_file, tmp / "out"), "--per_device_train_batch_size", "1",
        "--save_strategy", "steps", "--save_steps", "2"], env=env)
    return tmp / "out", json.loads((tmp / "out" / "metrics.json").read_text())


def test_sft_zero3_two_processes_equals_one_process(sft_zero3, tiny_model_dir, session1_file, tmp_path, env):
    import subprocess
    import sys

    from safetensors.torch import load_file

    out, z3 = sft_zero3
    assert (z3["distributed_type"], z3["num_processes"], z3["global_step"]) == ("DEEPSPEED", 2, 4)
    assert z3["examples"]["train"] == 4
    one = tmp_path / "one"
    proc = subprocess.run([sys.executable, "-m", "memgym.launch.cli", "train", "sft",
                           *_sft_args(tiny_model_dir, session1_file, one), "--per_device_train_batch_size", "2",
                           "--save_strategy", "no"],
                          cwd=Path(__file__).resolve().parents[2], capture_output=True, text=True, timeout=400,
                          env=dict(os.environ, OMP_NUM_THREADS="2", **env))
    assert proc.returncode == 0, proc.stderr[-3000:]
    ref = json.loads((one / "metrics.json").read_text())
    assert (ref["distributed_type"], ref["num_processes"]) == ("NO", 1)
    z3_loss, ref_loss = _losses(z3), _losses(ref)
    assert list(z3_loss) == [1, 2, 3, 4]
    assert z3_loss[1] - z3_loss[4] > 2.0  # the steps move the loss (13.83 -> 10.80 measured)
    assert z3_loss == pytest.approx(ref_loss, rel=1e-5)
    for k in ("train_loss_start", "train_loss_end", "eval_loss_start", "eval_loss_end"):
        assert z3[k] == pytest.approx(ref[k], rel=1e-5), k
    # the in-trainer measurement at steps 0 and 4 (greedy; under ZeRO-3 every process measures with the
    # policy gathered from its shards, the main process logs)
    mem = _memory_eval(z3["log_history"])
    assert [m["step"] for m in mem] == [0, 4] and mem[0]["memory_eval/validation_rows"] == 2.0
    assert mem == _memory_eval(ref["log_history"])
    # zero3_save_16bit_model gathered the shards into one whole model file (fp32: the training dtype),
    # trained as the 1-process model: the two updates differ by 5e-6 of their norm (measured). Adam
    # turns float noise in near-zero gradients (embedding rows of unseen tokens) into steps up to
    # ~lr, so single weights can differ by 1e-4 while the update as a whole agrees.
    z3_w, ref_w = load_file(str(out / "model.safetensors")), load_file(str(one / "model.safetensors"))
    init = load_file(str(tiny_model_dir / "model.safetensors"))
    assert sum(t.numel() for t in z3_w.values()) == TINY_PARAMS
    assert z3_w["model.embed_tokens.weight"].shape == (49152, 64)
    assert set(z3_w) == set(ref_w) == set(init)
    diff = sum(float((z3_w[k] - ref_w[k]).norm() ** 2) for k in init) ** 0.5
    update = sum(float((ref_w[k] - init[k]).norm() ** 2) for k in init) ** 0.5
    assert update > 1.0 and diff / update < 1e-4


def test_sft_zero3_checkpoint_resumes_to_the_uninterrupted_run(sft_zero3, tiny_model_dir, session1_file, tmp_path,
                                                                env):
    import torch

    out, z3 = sft_zero3
    ckpt = out / "checkpoint-2"
    for rank in (0, 1):  # one shard per process: each holds half the fp32 weights and their Adam states
        shard = torch.load(ckpt / "global_step2" / f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt",
                           map_location="cpu", weights_only=False)["optimizer_state_dict"]
        assert (int(shard["zero_stage"]), shard["partition_count"]) == (3, 2)
        assert sum(t.numel() for t in shard["fp32_flat_groups"]) == TINY_PARAMS // 2
        assert (ckpt / "global_step2" / f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt").is_file()
    resumed = tmp_path / "resumed"
    memgym_launch("cpu_deepspeed_zero3", "sft", [
        *_sft_args(tiny_model_dir, session1_file, resumed), "--per_device_train_batch_size", "1",
        "--save_strategy", "no", "--resume_from_checkpoint", str(ckpt)], env=env)
    r = json.loads((resumed / "metrics.json").read_text())
    assert r["global_step"] == 4
    losses = _losses(r)
    assert losses == pytest.approx(_losses(z3), rel=1e-6)  # steps 1-2 from the checkpoint's history, 3-4 trained
    assert losses[3] < losses[2] - 1.0  # step 3 starts from the restored weights and Adam states, not step 0's
    assert (r["train_loss_end"], r["eval_loss_end"]) == pytest.approx((z3["train_loss_end"], z3["eval_loss_end"]),
                                                                      rel=1e-6)


def _adrpo(config: str, planted: Path, tmp: Path, env: dict, *extra: str) -> tuple[list[str], list[dict]]:
    out = tmp / config
    memgym_launch(config, "adrpo", [
        "--model_name_or_path", str(planted), "--output_dir", str(out), "--train_trajectories", "conv-26",
        "--sessions", "1", "--embedder", "hash:64", "--screen_rows", "2",
        "--lora_r", "4", "--lora_alpha", "8", "--lora_dropout", "0.0", "--lora_target_modules", "q_proj", "v_proj",
        "o_proj", "--num_generations", "4", "--per_device_train_batch_size", "4", "--max_completion_length", "10",
        "--temperature", "1.0", "--learning_rate", "0.002", "--beta", "0.02", "--loss_type", "dapo",
        "--max_steps", "2", "--save_strategy", "no", "--eval_strategy", "steps", "--eval_steps", "2",
        "--per_device_eval_batch_size", "2", "--num_generations_eval", "2",
        "--memory_eval_trajectories", "conv-30", "--memory_eval_sessions", "1", "--memory_eval_rows", "2",
        "--memory_eval_max_new_tokens", "10", *COMMON, *extra], env=env)
    screen = json.loads((out / "screen.json").read_text())["chosen"]
    return screen, json.loads((out / "trainer_state.json").read_text())["log_history"]


def _steps(history: list[dict]) -> list[dict]:
    return [{k: h[k] for k in ("step", "loss", "reward", "kl")} for h in history if "loss" in h and "reward" in h]


def _memory_eval(history: list[dict]) -> list[dict]:
    return [h for h in history if any(k.startswith("memory_eval/") for k in h)]


@pytest.fixture(scope="module")
def adrpo_zero3(planted_dir, tmp_path_factory, env):
    return _adrpo("cpu_deepspeed_zero3", planted_dir, tmp_path_factory.mktemp("adrpo_zero3"), env)


def test_adrpo_zero3_equals_ddp(adrpo_zero3, planted_dir, tmp_path, env):
    """Screening (every process, weights gathered from zero.Init's shards), 2 GRPO steps, the GRPO
    evaluation and the in-trainer measurement equal 2-process DDP's."""
    screen, z3 = adrpo_zero3
    ddp_screen, ddp = _adrpo("cpu_ddp", planted_dir, tmp_path, env)
    assert screen == ddp_screen == ["conv-26/s1/episodic", "conv-26/s1/semantic"]
    steps, ref = _steps(z3), _steps(ddp)
    assert [s["step"] for s in steps] == [s["step"] for s in ref] == [1, 2]
    assert steps[0]["loss"] != 0.0 and steps[1]["kl"] > 0.0  # step 1 has a gradient, step 2 samples a moved policy
    for got, want in zip(steps, ref):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-7)
    assert [h["step"] for h in z3 if "eval_reward" in h] == [2]
    assert [h["eval_reward"] for h in z3 if "eval_reward" in h] == \
        pytest.approx([h["eval_reward"] for h in ddp if "eval_reward" in h], abs=1e-6)
    mem = _memory_eval(z3)
    assert [m["step"] for m in mem] == [2] and mem[0]["memory_eval/validation_rows"] == 2.0
    assert mem == _memory_eval(ddp)


def test_adrpo_zero3_without_gathering_for_generation(adrpo_zero3, planted_dir, tmp_path, env):
    """``ds3_gather_for_generation false``: generation runs through ZeRO-3's per-layer gathers
    (``generate`` with ``synced_gpus``) instead of one gather of the whole policy; same weights,
    same completions, same steps."""
    screen, z3 = adrpo_zero3
    ng_screen, ng = _adrpo("cpu_deepspeed_zero3", planted_dir, tmp_path, env, "--ds3_gather_for_generation", "false")
    assert ng_screen == screen
    assert len(_steps(ng)) == 2
    for got, want in zip(_steps(ng), _steps(z3)):
        assert got == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert _memory_eval(ng) == _memory_eval(z3)
