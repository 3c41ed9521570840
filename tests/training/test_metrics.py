"""Training evidence: the format-failure counter on hand-written manager outputs, and an SFT
run killed after a checkpoint and resumed ends with the weights and loss curve of an
uninterrupted run (the seeded random-weight tiny Llama with SmolLM2's real tokenizer)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from memgym.data_synth.paths import expert_dir
from memgym.memory_bank.bank import MemoryBank
from memgym.training.metrics import FormatTally

CONV26 = expert_dir() / "conv-26.jsonl"

GOOD_CORE = '{"operation": "APPEND", "content": "Alice: a nurse in Boston; likes tea."}'
GOOD_CORE_NONE = '{"operation": "NONE"}'
GOOD_EPISODIC = '{"operations": [{"action": "ADD", "memory": "2023-05-08: Alice went hiking with Bob"}]}'
GOOD_PROCEDURAL = '{"operations": []}'
PROSE = "Sure! Here are the memories: Alice went hiking with Bob on Monday."
UPDATE_S3 = '{"operations": [{"action": "UPDATE", "id": "S3", "memory": "Alice - Job: nurse"}]}'
REPLACE_BOB = '{"operation": "REPLACE", "old_text": "Bob", "new_text": "Robert"}'
CUT_OFF = '{"operations": [{"action": "ADD", "memory": "Steps to bake bread: 1. mix flour'
UPDATE_E1 = '{"operations": [{"action": "UPDATE", "id": "E1", "memory": "2023-05-08: Alice hiked Mt Tam"}]}'


def test_format_tally_counts_good_and_bad_outputs():
    bank = MemoryBank()
    bank.apply_text("episodic", GOOD_EPISODIC, 1)  # the bank now holds E1
    before = bank.to_json()
    t = FormatTally()
    assert t.add("core", GOOD_CORE) is None
    assert t.add("core", GOOD_CORE_NONE) is None
    assert t.add("core", REPLACE_BOB) == "replace_text_not_found"  # the empty core has no "Bob"
    assert t.add("episodic", GOOD_EPISODIC) is None
    assert t.add("episodic", PROSE) is not None
    assert t.add("episodic", UPDATE_E1, bank=bank, session=2) is None
    assert t.add("episodic", UPDATE_E1) == "unknown_id"  # an empty bank has no E1
    assert t.add("semantic", UPDATE_S3, bank=bank) == "unknown_id"
    assert t.add("procedural", GOOD_PROCEDURAL) is None
    assert t.add("procedural", CUT_OFF, finish_reason="length") == "truncated"
    assert t.attempts == {"core": 3, "episodic": 4, "semantic": 1, "procedural": 2}
    assert t.failures == {"core": 1, "episodic": 2, "semantic": 1, "procedural": 1}
    assert t.rate() == {"core": pytest.approx(1 / 3), "episodic": 0.5, "semantic": 1.0, "procedural": 0.5}
    assert t.overall() == pytest.approx(5 / 10)
    assert t.by_type["unknown_id"] == 2 and t.by_type["truncated"] == 1 and t.by_type["replace_text_not_found"] == 1
    assert sum(t.by_type.values()) == 5
    assert bank.to_json() == before  # counting never changes the bank it is given
    assert {**bank.counts(), "core_chars": len(bank.core)} == {"episodic": 1, "semantic": 0, "procedural": 0, "core_chars": 0}
    assert FormatTally().rate() == {"core": None, "episodic": None, "semantic": None, "procedural": None}
    assert FormatTally().overall() is None
    with pytest.raises(ValueError, match="unknown manager 'facts'"):
        t.add("facts", GOOD_CORE)


def test_format_tally_adds_a_construction_result(stub_backend):
    """The counter over a real construction: one session, four scripted manager outputs, one bad."""
    from memgym.data_synth.datasets import conversations_by_id
    from memgym.memory_bank.construct import ModelExtractor, construct

    conv = conversations_by_id("locomo", ["conv-26"])["conv-26"]
    backend = stub_backend([GOOD_CORE, GOOD_EPISODIC, PROSE, GOOD_PROCEDURAL])
    built = construct(conv, ModelExtractor(backend), n_sessions=1)
    t = FormatTally()
    t.add_construction(built)
    assert t.attempts == {"core": 1, "episodic": 1, "semantic": 1, "procedural": 1}
    assert t.failures == {"core": 0, "episodic": 0, "semantic": 1, "procedural": 0}
    assert {**built.bank.counts(), "core_chars": len(built.bank.core)} == {"episodic": 1, "semantic": 0, "procedural": 0,
                                     "core_chars": len("Alice: a nurse in Boston; likes tea.")}


class _Killed(RuntimeError):
    pass


def _sft_argv(model_dir: Path, traj: Path, out: Path) -> list[str]:
    return ["--model_name_or_path", str(model_dir), "--use_peft", "false", "--output_dir", str(out),
            "--train_trajectories", str(traj), "--eval_trajectories", str(traj),
            "--managers", "core", "procedural", "--embedder", "none", "--max_length", "1100",
            "--max_eval_examples", "1",  # the before/after loss probes (not asserted here): 1 row each
            "--max_steps", "4", "--num_train_epochs", "4", "--per_device_train_batch_size", "1",
            "--learning_rate", "3e-3", "--lr_scheduler_type", "linear", "--warmup_steps", "1",
            "--activation_checkpointing", "false", "--logging_steps", "1", "--eval_strategy", "no",
            "--save_strategy", "steps", "--save_steps", "2", "--report_to", "none", "--disable_tqdm", "true",
            "--seed", "0"]


def test_sft_killed_after_a_checkpoint_resumes_to_the_same_weights(tiny_model_dir, tmp_path):
    """Full fine-tuning, 4 steps over 2 shuffled examples (2 epochs, linear decay): run A goes
    through; run B dies in step 3 (after checkpoint-2, before checkpoint-4) and is restarted
    with ``--resume_from_checkpoint true``. B trains only steps 3-4 and ends with A's weights
    and A's per-step losses."""
    import torch
    from safetensors.torch import load_file
    from transformers import TrainerCallback

    from memgym.training.sft import parse_args, run

    traj = tmp_path / "conv-26-s1.jsonl"
    traj.write_text(CONV26.read_text().splitlines()[0] + "\n")

    class KillAtStep3(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 3:
                raise _Killed("killed in step 3")

    class CountSteps(TrainerCallback):
        steps: list[int] = []

        def on_step_end(self, args, state, control, **kw):
            self.steps.append(state.global_step)

    a = run(*parse_args(_sft_argv(tiny_model_dir, traj, tmp_path / "a")))
    with pytest.raises(_Killed):
        run(*parse_args(_sft_argv(tiny_model_dir, traj, tmp_path / "b")), callbacks=[KillAtStep3()])
    assert (tmp_path / "b" / "checkpoint-2" / "trainer_state.json").is_file()
    assert not (tmp_path / "b" / "checkpoint-4").exists() and not (tmp_path / "b" / "metrics.json").exists()
    counter = CountSteps()
    b = run(*parse_args(_sft_argv(tiny_model_dir, traj, tmp_path / "b") + ["--resume_from_checkpoint", "true"]),
            callbacks=[counter])
    assert counter.steps == [3, 4]  # nothing retrained
    assert a["global_step"] == b["global_step"] == 4

    def losses(m):
        return [(h["step"], h["loss"]) for h in m["log_history"] if "loss" in h]

    assert [s for s, _ in losses(a)] == [1, 2, 3, 4]
    assert [s for s, _ in losses(b)] == [1, 2, 3, 4]  # steps 1-2 come back from the checkpoint's history
    assert [x for _, x in losses(b)] == pytest.approx([x for _, x in losses(a)], rel=1e-6)
    wa, wb = load_file(str(tmp_path / "a" / "model.safetensors")), load_file(str(tmp_path / "b" / "model.safetensors"))
    w0 = load_file(str(tiny_model_dir / "model.safetensors"))
    assert wa.keys() == wb.keys()
    for k in wa:
        torch.testing.assert_close(wb[k], wa[k], rtol=0, atol=1e-6, msg=k)
    assert any(not torch.equal(wa[k], w0[k]) for k in wa)  # training changed the weights
    assert json.loads((tmp_path / "b" / "metrics.json").read_text())["global_step"] == 4


@pytest.mark.parametrize("name,expect", [
    ("train_cpu/sft", dict(use_peft=False, max_length=2048, learning_rate=1e-4, save_steps=17, num_train_epochs=1,
                           eval_steps=34, segment_tokens=200, max_empty_per_manager=4)),
    ("demo_train_sft", dict(use_peft=False, max_length=2048, learning_rate=1e-4, max_steps=16, seed=0,
                            segment_tokens=200, max_empty_per_manager=0)),
])
def test_sft_recipes_parse(name, expect):
    """The SFT recipes parse; both train on 200-token segments (demo_train_sft: 16 steps, content examples only)."""
    from memgym.training.sft import parse_args

    repo = Path(__file__).resolve().parents[2]
    recipe = next(p for p in (repo / "launch" / "recipes" / f"{name}.yaml",
                              repo / "scripts" / "experiments" / f"{name}.yaml") if p.is_file())
    script_args, training_args, model_args = parse_args(["--config", str(recipe)])
    for field_name, value in expect.items():
        obj = next(o for o in (model_args, training_args, script_args) if hasattr(o, field_name))
        assert getattr(obj, field_name) == value, field_name
    assert training_args.lr_scheduler_type == "constant_with_warmup" and training_args.warmup_steps == 3

