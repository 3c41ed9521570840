"""A trained extractor inside a memory program: the tiny random-weight Llama (SmolLM2's real
tokenizer) is fine-tuned by memgym's own SFT (``memgym.training.sft.run``, full fine-tuning) on a
trajectory whose manager outputs name the answers to conv-30's first questions; then
``memgym program eval <seed program> --extractor hf:<trained dir>`` builds the bank with it.
Its units must reach the program's index and score above 0 (the random-weight model of
``test_program_runner`` writes no valid JSON: 0 units, score 0)."""
from __future__ import annotations

import json

from memgym.data_synth.paths import expert_dir
from memgym.memory_bank.programs import seed_program_path

CONV30 = expert_dir() / "conv-30.jsonl"
MEMORY = "2023-01-19: Jon lost his job as a banker; Gina lost her job at Door Dash; both destress by dancing"
#: One output that is valid for every manager (the core reads ``operation``, the parts read
#: ``operations``; extra keys are ignored), so the tiny model learns one constant string.
OUTPUT = {"operation": "APPEND", "content": "Jon and Gina both lost their jobs in January 2023.",
          "operations": [{"action": "ADD", "memory": MEMORY}]}
OUTPUTS = {m: OUTPUT for m in ("core", "episodic", "semantic", "procedural")}


def _trajectory(path):
    """conv-30's first two trajectory lines (their dates and QA) with OUTPUTS as every manager's output."""
    lines = []
    for line in CONV30.read_text().splitlines()[:2]:
        row = json.loads(line)
        row.update(OUTPUTS)
        lines.append(json.dumps(row))
    path.write_text("\n".join(lines) + "\n")
    return path


def test_trained_hf_extractor_units_reach_the_index_and_score(tiny_model_dir, tmp_path, capsys):
    from memgym.launch.cli import main as memgym
    from memgym.training.sft import parse_args, run

    traj = _trajectory(tmp_path / "scripted.jsonl")
    trained = tmp_path / "trained"
    m = run(*parse_args(["--model_name_or_path", str(tiny_model_dir), "--use_peft", "false",
                         "--output_dir", str(trained), "--train_trajectories", str(traj), "--eval_trajectories",
                         str(traj), "--embedder", "none", "--max_length", "2048", "--max_steps", "60",
                         "--max_eval_examples", "2",  # the loss probes: 2 of the 8 examples (before/after)
                         "--per_device_train_batch_size", "1", "--learning_rate", "5e-3",
                         "--lr_scheduler_type", "constant", "--activation_checkpointing", "false",
                         "--logging_steps", "10", "--eval_strategy", "no", "--save_strategy", "no",
                         "--report_to", "none", "--disable_tqdm", "true", "--seed", "0"]))
    assert m["examples"]["train"] == 8 and m["eval_loss_end"] < m["eval_loss_start"] / 20
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("\n".join(["dataset: locomo", "conversations: [conv-30]", "n_sessions: 2", "max_questions: 3",
                                 "plan_mode: question", "scorer: answer-recall", "validate: false", "stage_cache: none",
                                 "progress: false", "extractor_max_new_tokens: 96",
                                 f"cache: {tmp_path / 'responses.sqlite'}"]) + "\n")
    out = tmp_path / "run"
    rc = memgym(["program", "eval", str(seed_program_path()), "--recipe", str(recipe), "--extractor",
                 f"hf:{trained}", "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    ext = rep["extraction"]
    assert rep["ok"] and rep["n"] == 3 and ext["mode"] == "extractor" and rep["model_calls"]["extractor"] == 8
    # 2 sessions x 4 managers: at most one output of the 60-step tiny model fails (it is seeded: one
    # episodic output here); each applied output is one unit (the core block, or one new entry)
    failed = sum(ext["manager_failures"].values())
    assert failed <= 1 and "core" not in ext["manager_failures"]
    assert ext["units"] == 8 - failed and rep["diagnostics"]["n_units"] == ext["units"]
    assert (out / "units.jsonl").read_text().count("Door Dash") >= 3
    # every gold answer's tokens are in the units: 19 January, 2023 / January, 2023 / by dancing
    assert rep["overall"] > 0.5 and rep["diagnostics"]["overall"]["d_ext"] < 1.0
    assert "overall answer-recall" in capsys.readouterr().out
    # the same program with the extractor on 200-token segments (--extractor_segment_tokens, the cut of
    # segmented SFT): every segment is one call per manager, counted from the model's own tokenizer
    # (sessions 1-2: 7 + 5 segments). The tiny model was trained on whole-session prompts only, so its
    # outputs on segment prompts are not asserted; the cut and the calls are.
    from memgym.data_synth.datasets import load_conversations
    from memgym.memory_bank.construct import split_session
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(trained)
    (conv,) = load_conversations("locomo", None, ids=["conv-30"], n_sessions=2)
    n_segments = [len(split_session(s, [len(tok(t.render(), add_special_tokens=False)["input_ids"]) + 1
                                        for t in s.turns], 200)) for s in conv.sessions]
    assert n_segments == [7, 5]
    seg_out = tmp_path / "run_segments"
    rc = memgym(["program", "eval", str(seed_program_path()), "--recipe", str(recipe), "--extractor",
                 f"hf:{trained}", "--extractor_segment_tokens", "200", "--out", str(seg_out)])
    assert rc == 0
    seg = json.loads((seg_out / "report.json").read_text())
    assert seg["extraction"]["segments"] == sum(n_segments) and seg["extraction"]["sessions"] == 2
    assert seg["model_calls"]["extractor"] == 4 * sum(n_segments)
    assert rep["extraction"]["segments"] == 2  # whole sessions before
