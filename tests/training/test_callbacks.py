"""memgym.training.callbacks: the in-trainer measurement (validation session reward, per-manager format
failures, held-out answer recall through the one measure step) on a tiny random-weight model,
the held-out cut, and the ADRPO row screen (memgym.training.adrpo_data.screen_rows)."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerControl, TrainerState

from memgym.data_synth.datasets import load_conversations
from memgym.llm.base import Completion
from memgym.llm.embeddings import HashEmbedder
from memgym.memory_bank.actions import MANAGERS
from memgym.rewards.session_reward import SessionReward, SessionRewardConfig
from memgym.training.adrpo_data import ADRPODataError, screen_rows
from memgym.training.callbacks import PREFIX, MemoryEvalCallback, MemoryEvalFields, first_turns


def test_first_turns_keeps_the_qa_whose_evidence_lies_in_them():
    (conv,) = load_conversations("locomo", None, ids=["conv-41"], n_sessions=1)
    assert len(conv.sessions[0].turns) == 16 and len(conv.questions) == 5
    cut = first_turns(conv, 8)
    assert len(cut.sessions) == 1 and len(cut.sessions[0].turns) == 8 and len(cut.questions) == 3
    assert len(first_turns(conv, 12).questions) == 5


def test_callback_logs_every_measure_once_per_evaluation_step(tiny_model_dir):
    tok = AutoTokenizer.from_pretrained(str(tiny_model_dir))
    model = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    model.train()
    emb = HashEmbedder(64)
    fields = MemoryEvalFields(memory_eval_trajectories=["conv-30"], memory_eval_sessions=[1], memory_eval_rows=4)
    rows = fields.validation_rows(tok, emb, segment_tokens=200)
    assert [r.key for r in rows] == [f"conv-30/s1.1/{m}" for m in MANAGERS]
    assert sorted(r.manager for r in rows) == sorted(MANAGERS)
    reward = SessionReward(SessionRewardConfig(judge="answer-recall"), embedder=emb, tokenizer=tok)
    (conv,) = load_conversations("locomo", None, ids=["conv-41"], n_sessions=1)
    cb = MemoryEvalCallback(rows, reward, tok, embedder=emb, heldout=[first_turns(conv, 8)], segment_tokens=200,
                            max_new_tokens=8)
    state, control = TrainerState(), TrainerControl()
    state.global_step = 3
    args = SimpleNamespace()
    cb.on_evaluate(args, state, control, model=model)
    cb.on_evaluate(args, state, control, model=model)  # a second eval split at the same step: no second row
    assert len(state.log_history) == 1 and model.training  # the trainer's mode is given back
    row = state.log_history[0]
    assert row["step"] == 3 and row[f"{PREFIX}/validation_rows"] == 4.0
    # 8 random-weight tokens are never a manager's JSON: every output fails, the gate closes, reward 0
    assert [row[f"{PREFIX}/format_failure/{m}"] for m in MANAGERS] == [1.0] * 4
    assert row[f"{PREFIX}/validation_reward"] == 0.0 and row[f"{PREFIX}/validation_gate"] == 0.0
    assert [row[f"{PREFIX}/heldout_format_failure/{m}"] for m in MANAGERS] == [1.0] * 4
    # nothing applies, so the held-out bank is empty and its retrieved text holds no answer
    assert row[f"{PREFIX}/heldout_entries"] == 0.0 and row[f"{PREFIX}/heldout_qa"] == 3.0
    assert row[f"{PREFIX}/heldout_answer_recall"] == 0.0
    with pytest.raises(ValueError, match="nothing|no validation rows"):
        MemoryEvalCallback([], reward, tok, embedder=emb)


class _Backend:
    def __init__(self):
        self.calls = []

    def generate(self, batch, params):
        self.calls.append((len(batch), params.temperature, params.seed))
        return [Completion(f"out{i}", "stop") for i in range(len(batch))]


def test_screen_rows_keeps_the_first_rows_whose_rollouts_differ():
    rows = [SimpleNamespace(key=k, messages=[{"role": "user", "content": k}]) for k in ("a", "b", "c", "d")]
    table = {"a": [0.5] * 4, "b": [0.0, 0.25, 0.0, 0.0], "c": [0.1] * 4, "d": [1.0, 0.0, 1.0, 0.0]}

    def reward(samples, texts, finish_reasons=None):
        return [SimpleNamespace(reward=r) for r in table[samples[0].key]]

    backend = _Backend()
    chosen, screen = screen_rows(rows, reward, backend, n=2, num_generations=4, max_new_tokens=8, temperature=0.8,
                                 top_p=0.9, seed=0)
    assert [s.key for s in chosen] == ["b", "d"]
    assert [s["key"] for s in screen] == ["a", "b", "c", "d"] and screen[1]["rewards"] == [0.0, 0.25, 0.0, 0.0]
    assert backend.calls == [(4, 0.8, 0)] * 4
    chosen, screen = screen_rows(rows, reward, _Backend(), n=1, num_generations=4, max_new_tokens=8,
                                 temperature=0.8, top_p=0.9, seed=0)
    assert [s.key for s in chosen] == ["b"] and len(screen) == 2  # stops at the first n found
    with pytest.raises(ADRPODataError, match="none of the 2 rows"):
        screen_rows([rows[0], rows[2]], reward, _Backend(), n=1, num_generations=4, max_new_tokens=8,
                    temperature=0.8, top_p=0.9, seed=0)


def test_sft_trainer_state_holds_the_measurement_at_every_evaluation(tiny_model_dir, tmp_path):
    """memgym.training.sft.main with memory_eval_* fields: evaluations at step 0 (eval_on_start), step 2
    (eval_steps) and after training each append one memory_eval row; trainer_state.json (saved by
    the run) holds the validation reward and every manager's format-failure rate at each."""
    import json

    from memgym.training.sft import main

    out = tmp_path / "sft"
    rc = main(["--model_name_or_path", str(tiny_model_dir), "--output_dir", str(out),
               "--train_trajectories", "conv-26", "--eval_trajectories", "conv-30", "--max_examples", "2",
               "--max_eval_examples", "1", "--segment_tokens", "200", "--embedder", "none", "--max_length", "2048",
               "--max_steps", "2", "--per_device_train_batch_size", "1", "--learning_rate", "1e-3",
               "--use_peft", "false", "--activation_checkpointing", "false", "--logging_steps", "1",
               "--save_strategy", "no", "--eval_strategy", "steps", "--eval_steps", "2", "--report_to", "none",
               "--disable_tqdm", "true", "--memory_eval_trajectories", "conv-30", "--memory_eval_sessions", "1",
               "--memory_eval_rows", "4", "--memory_eval_max_new_tokens", "4"])
    assert rc == 0
    history = json.loads((out / "trainer_state.json").read_text())["log_history"]
    rows = [h for h in history if f"{PREFIX}/validation_reward" in h]
    assert [h["step"] for h in rows] == [0, 2]  # the final evaluate() is at step 2 again: measured once
    for h in rows:
        assert [h[f"{PREFIX}/format_failure/{m}"] for m in MANAGERS] == [1.0] * 4  # 4 tokens hold no JSON
        assert h[f"{PREFIX}/validation_reward"] == 0.0 and h[f"{PREFIX}/validation_rows"] == 4.0


def test_run_card_callback_writes_the_card_of_an_adrpo_recipe_on_the_main_process(tiny_model_dir, tmp_path):
    import json
    from types import SimpleNamespace

    from memgym.llm.runcard import dir_entry
    from memgym.rewards.reward_types import SessionRewardConfig
    from memgym.training.adrpo_config import ADRPOConfig, ADRPOScriptArguments
    from memgym.training.callbacks import RunCardCallback
    from memgym.training.common import PolicyModelConfig

    args = ADRPOConfig(output_dir=str(tmp_path / "a"), use_cpu=True, bf16=False, report_to="none", seed=7,
                       weighting="unclipped")
    script = ADRPOScriptArguments(embedder="hash:64")
    cb = RunCardCallback([script, SessionRewardConfig(lam=0.5), args,
                          PolicyModelConfig(model_name_or_path=str(tiny_model_dir))],
                         {"policy": str(tiny_model_dir), "init_from": None, "embedder": script.embedder,
                          "judge_model": None})
    cb.on_train_begin(args, SimpleNamespace(is_world_process_zero=False), None)
    assert not (tmp_path / "a" / "run_card.json").exists()  # another rank writes nothing
    cb.on_train_begin(args, SimpleNamespace(is_world_process_zero=True), None)
    cb.on_train_end(args, SimpleNamespace(is_world_process_zero=True), None)
    card = json.loads((tmp_path / "a" / "run_card.json").read_text())
    assert card["recipe"]["weighting"] == "unclipped" and card["recipe"]["model_name_or_path"] == str(tiny_model_dir)
    assert card["recipe"]["lam"] == 0.5 and card["recipe"]["embedder"] == "hash:64"  # every section's fields
    assert card["seeds"] == {"seed": 7, "data_seed": None} and card["wall_s"] >= 0
    assert card["models"]["policy"]["weights_sha256"] == dir_entry(tiny_model_dir)["weights_sha256"]
    assert card["models"]["embedder"] == {"spec": "hash:64", "model": None, "note": "no model: a hashing embedder"}
    assert set(card["models"]) == {"policy", "embedder"}
