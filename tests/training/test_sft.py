"""SFT: examples from replayed expert banks, prompt masking, and a real (tiny-model) training run.

The model is the seeded random-weight tiny Llama with SmolLM2's real tokenizer
(``tiny_model_dir``); nothing touches the hub. Token counts below were measured with that
tokenizer on the shipped conv-26 trajectory (session 1: core 955, episodic 1213, semantic 1184,
procedural 871 tokens for prompt + completion).
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memgym.data_synth.expert import load_trajectories, replay
from memgym.data_synth.paths import expert_dir
from memgym.memory_bank.actions import MANAGERS
from tests.helpers import trainable_state
from memgym.training.sft_data import (ExampleLengthError, TrainingDataError, chat_token_ids, drop_overlong,
                               expert_session_states, sft_examples)

CONV26 = expert_dir() / "conv-26.jsonl"
CONV30 = expert_dir() / "conv-30.jsonl"


@pytest.fixture(scope="module")
def conv26_examples():
    return sft_examples([CONV26])


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from memgym.training.common import load_tokenizer

    return load_tokenizer(tiny_model_dir)


@pytest.fixture(scope="module")
def session1_file(tmp_path_factory) -> Path:
    """conv-26's first trajectory line only (a valid trajectory: it replays from an empty bank)."""
    p = tmp_path_factory.mktemp("traj") / "conv-26-s1.jsonl"
    p.write_text(CONV26.read_text().splitlines()[0] + "\n")
    return p


def _user(row) -> str:
    assert [m["role"] for m in row["prompt"]] == ["system", "user"]
    return row["prompt"][1]["content"]


def test_one_example_per_manager_per_session(conv26_examples):
    ds = conv26_examples
    assert len(ds) == 19 * 4
    assert ds.column_names == ["prompt", "completion", "conversation_id", "session", "manager"]
    assert ds["manager"][:8] == list(MANAGERS) * 2
    assert ds["session"][:8] == [1, 1, 1, 1, 2, 2, 2, 2]
    assert set(ds["conversation_id"]) == {"conv-26"}
    steps = load_trajectories(CONV26)
    row = ds[4 * 1 + 1]  # session 2, episodic
    assert (row["session"], row["manager"]) == (2, "episodic")
    assert row["completion"][0]["content"] == json.dumps(steps[1].outputs["episodic"], ensure_ascii=False)
    comp = row["completion"]
    assert len(comp) == 1 and comp[0]["role"] == "assistant"
    assert json.loads(comp[0]["content"]) == steps[1].outputs["episodic"]


def test_prompt_uses_the_replayed_bank_before_the_session(conv26_examples):
    ds = conv26_examples
    s1_epi, s2_epi, s2_core = _user(ds[1]), _user(ds[5]), _user(ds[4])
    assert "Existing episodic entries (most relevant 0 of 0):\n(none)" in s1_epi
    bank = replay(CONV26, upto_session=1)  # the expert bank after session 1 = before session 2
    entries = bank.entries("episodic")
    assert [e.id for e in entries] == ["E1", "E2", "E3", "E4"]
    assert "Existing episodic entries (most relevant 4 of 4):" in s2_epi
    for e in entries:
        assert f"[{e.id}] {e.text}" in s2_epi
    assert "[E5]" not in s2_epi  # session 2's own additions are not in its prompt
    assert bank.core and bank.core in s2_core
    assert "Session 2 date:" in s2_epi and "D2:1" in s2_epi and "D1:1" not in s2_epi


def test_session_states_and_data_errors(tmp_path, session1_file):
    states = expert_session_states([CONV26])
    assert [s.session.index for s in states] == list(range(1, 20))
    assert states[0].bank_before.counts() == {"episodic": 0, "semantic": 0, "procedural": 0}
    assert states[1].bank_before.counts() == {"episodic": 4, "semantic": 5, "procedural": 0}
    with pytest.raises(TrainingDataError, match="duplicate session"):
        expert_session_states([session1_file, session1_file])
    line = json.loads(session1_file.read_text())
    line["session"] = 40
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps(line) + "\n")
    with pytest.raises(TrainingDataError, match=r"bad.jsonl: line 1 \(conversation conv-26, session 40\).*no session 40"):
        expert_session_states([bad])
    with pytest.raises(ValueError, match="unknown manager"):
        sft_examples([session1_file], managers=["core", "index"])
    with pytest.raises(ValueError, match="unknown dataset"):
        expert_session_states([session1_file], dataset="nosuch")


def test_drop_overlong_keeps_whole_examples(session1_file, tokenizer):
    ds = sft_examples([session1_file])
    lengths = [len(chat_token_ids(tokenizer, r["prompt"] + r["completion"])) for r in ds]
    assert lengths == [955, 1213, 1184, 871]
    kept, rep = drop_overlong(ds, tokenizer, 1000)
    assert kept["manager"] == ["core", "procedural"]
    assert (rep.kept, rep.dropped, rep.longest) == (2, 2, 1213)
    assert rep.dropped_keys == (("conv-26", 1, "episodic"), ("conv-26", 1, "semantic"))
    same, rep_all = drop_overlong(ds, tokenizer, None)
    assert len(same) == 4 and rep_all.dropped == 0
    with pytest.raises(ExampleLengthError, match="shortest 871"):
        drop_overlong(ds, tokenizer, 800)


def test_prompt_tokens_are_masked(session1_file, tiny_model_dir, tokenizer, tmp_path):
    from trl import SFTConfig

    from memgym.training.common import PolicyModelConfig, load_policy
    from memgym.training.sft import SFTData, SFTScriptArguments, build_trainer

    ds = sft_examples([session1_file], managers=["procedural"])
    policy = load_policy(PolicyModelConfig(model_name_or_path=str(tiny_model_dir)))
    args = SFTConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                     activation_checkpointing=False, max_length=1000)
    trainer = build_trainer(SFTScriptArguments(train_trajectories=[str(session1_file)]), args,
                            SFTData(ds, None, ds, {}), policy)
    ex = trainer.train_dataset[0]
    row = ds[0]
    n_prompt = len(chat_token_ids(tokenizer, row["prompt"], add_generation_prompt=True))
    assert n_prompt == 864
    ids, labels = ex["input_ids"], ex["labels"]
    assert len(ids) == len(labels) == 871
    assert labels[:n_prompt] == [-100] * n_prompt
    assert labels[n_prompt:] == ids[n_prompt:]
    assert tokenizer.decode(labels[n_prompt:]) == row["completion"][0]["content"] + "<|im_end|>\n"


def test_sft_run_trains_lora_and_loss_falls(session1_file, tiny_model_dir, tmp_path):
    """main(): 3 steps on one repeated example; LoRA B matrices (zero at init) move, the loss
    on that example falls, and the report files are written."""
    from safetensors.torch import load_file

    from memgym.training.sft import main

    out = tmp_path / "sft"
    rc = main(["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
               "--train_trajectories", str(session1_file), "--eval_trajectories", str(session1_file),
               "--managers", "procedural", "--embedder", "none", "--max_length", "1000",
               "--max_steps", "3", "--per_device_train_batch_size", "1", "--learning_rate", "1e-2",
               "--lr_scheduler_type", "constant", "--lora_r", "4", "--lora_alpha", "8",
               "--activation_checkpointing", "false", "--logging_steps", "1", "--save_strategy", "no",
               "--report_to", "none", "--disable_tqdm", "true"])
    assert rc == 0
    m = json.loads((out / "metrics.json").read_text())
    assert m["global_step"] == 3 and m["examples"] == {"train": 1, "train_probe": 1, "valid": 1}
    assert m["distributed_type"] == "NO" and m["num_processes"] == 1
    step_losses = [h["loss"] for h in m["log_history"] if "loss" in h]
    assert len(step_losses) == 3 and step_losses[-1] < step_losses[0]
    assert m["train_loss_end"] < m["train_loss_start"]
    assert m["eval_loss_start"] == pytest.approx(m["train_loss_start"])  # same single example
    lora = load_file(str(out / "adapter_model.safetensors"))
    b_mats = {k: v for k, v in lora.items() if "lora_B" in k}
    assert len(b_mats) == 2 * 4  # 2 layers x q,k,v,o
    assert all(float(v.abs().sum()) > 0 for v in b_mats.values())
    assert json.loads((out / "adapter_config.json").read_text())["r"] == 4
    for f in ("loss.png", "report.md", "tokenizer_config.json"):
        assert (out / f).is_file(), f
    assert "| validation split |" in (out / "report.md").read_text()
    # the run card beside trainer_state.json: the recipe, the policy's weights, the trajectory read, the wall time
    from memgym.launch.cmd_reproduce import load_card
    from memgym.llm.runcard import dir_entry

    card, where = load_card(out / "trainer_state.json")
    assert where == out / "run_card.json" and card == m["run_card"] and card["wall_s"] > 0
    assert card["recipe"]["max_steps"] == 3 and card["seeds"] == {"seed": 42, "data_seed": None}
    assert card["models"]["policy"]["weights_sha256"] == dir_entry(tiny_model_dir)["weights_sha256"] is not None
    assert any(e["path"] == str(session1_file.resolve()) and e["kind"] == "trajectory file" for e in card["inputs"])
    assert "## Run card" in (out / "report.md").read_text()

    # The adapter dir is a starting point for the next stage (ADRPO's init_from): it loads as a
    # trainable PeftModel over its base, with exactly the saved LoRA weights.
    from memgym.training.common import PolicyModelConfig, load_policy

    policy = load_policy(PolicyModelConfig(model_name_or_path=str(out)))
    assert policy.is_adapter and policy.peft_config is None and policy.base_path == str(tiny_model_dir)
    state = trainable_state(policy.model)
    assert len(state) == 16 and all("lora_" in k for k in state)
    saved = {k.replace(".weight", ""): v for k, v in lora.items()}
    for k, v in state.items():
        key = k.replace(".default", "").replace(".weight", "")
        assert (saved[key] == v).all(), k


def test_common_cli_helpers():
    from trl import get_peft_config

    from memgym.llm.specs import resolve_model_path
    from memgym.training.common import PolicyModelConfig, device_defaults

    assert device_defaults(cuda=False) == {"use_cpu": True, "bf16": False, "fp16": False}
    assert device_defaults(cuda=True) == {}
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_model_path("./no/such/model")
    assert resolve_model_path("Qwen/Qwen3-4B-Instruct-2507") == "Qwen/Qwen3-4B-Instruct-2507"
    cfg = get_peft_config(PolicyModelConfig(lora_r=8, lora_alpha=16, lora_dropout=0.0, lora_target_modules=["q_proj"]))
    assert (cfg.r, cfg.lora_alpha, set(cfg.target_modules)) == (8, 16, {"q_proj"})
    default = get_peft_config(PolicyModelConfig())
    assert (default.r, set(default.target_modules)) == (16, {"q_proj", "k_proj", "v_proj", "o_proj"})
    assert get_peft_config(PolicyModelConfig(use_peft=False)) is None
    with pytest.raises(ValueError, match="lora_dropout"):
        PolicyModelConfig(lora_dropout=1.0)
    with pytest.raises(ValueError, match="dtype"):
        PolicyModelConfig(dtype="int8")


def test_cli_config_and_errors(tmp_path, capsys):
    from memgym.training.sft import PROG, main, parse_args

    recipe = Path(__file__).resolve().parents[2] / "launch" / "recipes" / "sft_cpu.yaml"
    s, t, m = parse_args(["--config", str(recipe), "--max_steps", "3", "--lora_r", "8"])
    assert (m.model_name_or_path, m.use_peft, m.lora_r, s.max_examples) == ("smollm2", True, 8, 4)
    assert (t.max_steps, t.max_length, t.use_cpu, t.bf16, t.activation_checkpointing) == (3, 2048, True, False, False)
    assert s.train_trajectories == [str(CONV26)] and s.eval_trajectories == [str(CONV30)]
    bad = tmp_path / "bad.yaml"
    bad.write_text("output_dir: x\nnot_a_field: 3\n")
    from memgym.launch.cli import main as memgym
    from memgym.llm.errors import ConfigError

    # standalone entry (what `memgym launch` runs): one line, exit status 2
    assert main(["--config", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == (f"{PROG}: recipe {bad}: unknown field(s): not_a_field; "
                                               "--help lists every field")
    assert main(["--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml not found" in capsys.readouterr().err
    assert main(["--output_dir", str(tmp_path), "--managers", "index"]) == 2
    assert "unknown manager" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="unknown field.*not_a_field"):
        parse_args(["--config", str(bad)])
    # through memgym train: one line, exit status 2 (memgym.launch.cli.run_command)
    assert memgym(["train", "sft", "--config", str(bad)]) == 2
    assert capsys.readouterr().err.strip() == (f"memgym train sft: recipe {bad}: unknown field(s): not_a_field; "
                                               "--help lists every field")
    assert memgym(["train", "sft", "--config", str(tmp_path / "missing.yaml")]) == 2
    assert "missing.yaml not found" in capsys.readouterr().err
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "--train_trajectories" in capsys.readouterr().out
