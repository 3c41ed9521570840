"""Tests of :mod:`memgym.evolution.evaluation.program_eval`."""
from __future__ import annotations

import json

import pytest

from memgym.launch.cli import main as memgym
from memgym.memory_bank.programs import seed_program_path
from tests.data_synth.test_beam import _beam_chat
from tests.evolution.execution.test_runner import SEED, make_runner
from tests.helpers import conversation


def test_program_eval_where_every_retrieve_fails_exits_1(tmp_path, capsys, monkeypatch):
    from memgym.memory_bank.programs import read_program_source, seed_program_path

    src = read_program_source(seed_program_path()).replace(
        '        return "\\n".join(self.lines)[:OUT_CHAR_BUDGET]', '        raise ValueError("boom")')
    prog = tmp_path / "p.py"
    prog.write_text(src)
    rc = memgym(["program", "eval", str(prog), "--no_validate", "--extractor", "expert:conv-30", "--conversations",
                 "conv-30", "--n_sessions", "1", "--plan_mode", "question", "--no_diagnostics", "--no_progress",
                 "--stage_cache", "none", "--cache", "none", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 1 and "every Memory.retrieve call failed" in err and "boom" in err
    assert json.loads((tmp_path / "o" / "report.json").read_text())["retrieve_errors"] > 0


def test_program_eval_on_a_beam_folder_defaults_to_its_chats(tmp_path):
    from memgym.memory_bank.programs import seed_program_path

    folder = _beam_chat(tmp_path)
    out = tmp_path / "pe"
    rc = memgym(["program", "eval", str(seed_program_path()), "--dataset", "beam", "--path", str(folder),
                 "--n_sessions", "1", "--max_questions", "2", "--extractor", "turns", "--plan_mode", "question",
                 "--scorer", "rubric-recall", "--no_diagnostics", "--no_validate", "--stage_cache", "none",
                 "--cache", str(tmp_path / "r.sqlite"), "--no_progress", "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["conversations"] == ["100K-3"] and rep["n"] == 2


def _recipe(tmp_path, **extra) -> str:
    lines = ["dataset: locomo", "conversations: [conv-30]", "n_sessions: 2", "max_questions: 3", "plan_mode: question",
             "scorer: answer-recall", "validate: false", "stage_cache: none", "progress: false",
             f"cache: {tmp_path / 'responses.sqlite'}"] + [f"{k}: {v}" for k, v in extra.items()]
    p = tmp_path / "recipe.yaml"
    p.write_text("\n".join(lines) + "\n")
    return str(p)


def test_cli_eval_with_a_trained_extractor_hf(tmp_path, tiny_model_dir, capsys):
    from memgym.launch.cli import main as memgym

    out = tmp_path / "run"
    rc = memgym(["program", "eval", str(seed_program_path()), "--recipe", _recipe(tmp_path, extractor_max_new_tokens=16),
                 "--extractor", f"hf:{tiny_model_dir}", "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["ok"] and rep["n"] == 3 and rep["extraction"]["mode"] == "extractor"
    # a random-weight model never writes valid manager JSON: 2 sessions x 4 managers fail, 0 units
    assert rep["extraction"]["manager_failures"] == {"core": 2, "episodic": 2, "semantic": 2, "procedural": 2}
    # the 8 rejected outputs are counted as such; no session failed as a whole (the bank just kept its state)
    assert rep["extraction"]["failed_manager_outputs"] == 8 and rep["extraction"]["format_failures"] == 0
    assert rep["conversations"] == ["conv-30"]
    assert rep["extraction"]["units"] == 0 and rep["model_calls"]["extractor"] == 8
    assert rep["overall"] == 0.0 and rep["diagnostics"]["overall"]["d_ext"] == 0.0
    assert rep["diagnostics"]["n_units"] == 0 and rep["diagnostics"]["mean_unit_chars"] is None
    assert rep["stages_run"] == ["extract", "index", "plan", "retrieve", "score"] and rep["stages_skipped"] == ["answer"]
    assert set(rep["by_capability"]) <= set("FTPMA") and sum(v["n"] for v in rep["by_category"].values()) == 3
    assert len((out / "tasks.jsonl").read_text().splitlines()) == 3
    assert len((out / "units.jsonl").read_text().splitlines()) == 2
    assert "| capability | n | score | d_ext | d_idx | d_ret |" in (out / "report.md").read_text()
    assert "overall answer-recall 0.000" in capsys.readouterr().out


def test_cli_eval_errors(tmp_path, capsys):
    from memgym.launch.cli import main as memgym

    assert memgym(["program", "eval", str(tmp_path / "nope.py"), "--recipe", _recipe(tmp_path)]) == 2
    assert "not found" in capsys.readouterr().err
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    out = tmp_path / "o"
    assert memgym(["program", "eval", str(bad), "--recipe", _recipe(tmp_path), "--validate", "true",
                   "--out", str(out)]) == 1
    assert "validation failed at level 1" in capsys.readouterr().err
    assert json.loads((out / "report.json").read_text())["validation"]["level"] == 1
    assert memgym(["program", "eval", str(bad), "--recipe", _recipe(tmp_path), "--plan_mode", "psychic"]) == 2
    assert "plan_mode" in capsys.readouterr().err


def test_program_eval_refuses_a_folder_of_user_files(tmp_path, capsys):
    bad = tmp_path / "bad.py"
    bad.write_text("import os\n")
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    args = ["program", "eval", str(bad), "--recipe", _recipe(tmp_path), "--validate", "true", "--out"]
    assert memgym([*args, str(mine)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"memgym program eval: {mine} holds files but no memgym program eval output (report.md); memgym program eval "
        "writes report.json, report.md, tasks.jsonl, units.jsonl there: choose a new or empty folder"]
    assert [p.name for p in mine.iterdir()] == ["report.md"] and (mine / "report.md").read_text() == "my notes"
    # its own earlier outputs are not foreign: a rerun into the same folder runs (and fails validation, exit 1)
    out = tmp_path / "o"
    assert memgym([*args, str(out)]) == 1 and memgym([*args, str(out)]) == 1
    assert "validation failed at level 1" in capsys.readouterr().err.splitlines()[-1]


def test_evaluate_program_returns_a_typed_result():
    from memgym.evolution.execution.runner import evaluate_program
    from memgym.evolution.execution.results import ProgramEvaluation

    runner, _, _ = make_runner(plan_mode="question")
    runner.settings.extractor = "turns"
    ev, run = evaluate_program(SEED, [conversation()], runner)
    assert isinstance(ev, ProgramEvaluation) and ev.ok and ev.n == 4
    assert ev.overall == 0.75
    assert ev.scores() == {"overall": 0.75, "by_capability": {"F": 1.0, "M": 1.0, "T": 0.0}}
    assert ev.task_scores() == {"c/c/q0": 1.0, "c/c/q1": 1.0, "c/c/q2": 0.0, "c/c/q3": 1.0}
    assert ev.to_dict(tasks=False)["stages_skipped"] == ["answer"] and "tasks" not in ev.to_dict(tasks=False)
    # one result type per question, shared with the run; report.json keeps its layout
    from memgym.rewards.scoring.summary import ROW_VIEWS, QuestionResult
    assert run.tasks is ev.questions and all(isinstance(q, QuestionResult) for q in ev.questions)
    assert list(ev.tasks[0]) == [*ROW_VIEWS["task"], "d_ext", "d_idx", "d_ret"] and ev.tasks[0]["trace"] == "tasks.jsonl:1"
    assert list(ev.questions[0].to_dict()) == list(ROW_VIEWS["score"])
    assert list(ev.to_dict()) == ["ok", "n", "overall", "by_capability", "by_category", "diagnostics", "stages_run",
                                  "stages_reused", "stages_skipped", "stage_items", "stage_llm_calls", "reuse",
                                  "component_hashes", "extraction", "plan_failures", "retrieve_errors", "empty_answers",
                                  "judge_unparsable", "summary", "judge_protocol", "failed_conversations", "judge_calls",
                                  "model_calls", "tokens", "wall_s", "tasks", "validation", "program", "program_sha256",
                                  "parent", "config"]
    assert ev.to_dict()["summary"]["n"] == 4 and "by_capability" not in ev.to_dict()["summary"]


def test_cli_eval_turns_on_longmemeval(tmp_path):
    from memgym.data_synth.paths import data_root
    from memgym.launch.cli import main as memgym

    oracle = data_root() / "longmemeval" / "longmemeval_oracle.json"
    qid = json.loads(oracle.read_text())[0]["question_id"]
    out = tmp_path / "lme"
    rc = memgym(["program", "eval", str(seed_program_path()), "--dataset", "longmemeval", "--path", str(oracle),
                 "--conversations", qid, "--extractor", "turns", "--plan_mode", "question", "--validate", "false",
                 "--progress", "false", "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["n"] == 1 and rep["extraction"]["mode"] == "turns" and rep["model_calls"].get("task", 0) == 0
    units = [json.loads(x) for x in (out / "units.jsonl").read_text().splitlines()]
    turns = json.loads(oracle.read_text())[0]["haystack_sessions"]
    assert sum(len(u["units"]) for u in units) == sum(len(s) for s in turns)
    assert units[0]["units"][0]["content"].split(": ", 1)[0] in ("user", "assistant")


def test_report_header_names_the_conversations_that_ran():
    """A ``--split valid`` run evaluates the split's conversations, not the recipe's default
    ``conversations`` list (conv-26, conv-30), and the header says so."""
    from memgym.evolution.evaluation.program_eval import _selection

    cfg = {"conversations": ["conv-26", "conv-30"], "split": "valid"}
    assert _selection({"config": cfg, "conversations": ["conv-41", "conv-42"]}) == "split valid: conv-41, conv-42"
    assert _selection({"config": {**cfg, "split": None}, "conversations": ["conv-26"]}) == "conv-26"
    assert _selection({"config": {**cfg, "split": None}}) == "conv-26, conv-30"  # a report written before the field
    many = [f"c{i}" for i in range(14)]
    assert _selection({"config": {"split": None}, "conversations": many}).endswith("c11, ... (14 conversations)")


def test_program_eval_context_budget_is_the_evolve_budget(tmp_path):
    """``context_tokens 64`` cuts every retrieved text to a 64-token prefix
    (:class:`ContextBudget`, the budget `memgym evolve --context_tokens` applies), so an
    evolved program is scored under the budget it was evolved with; without it the text is whole."""
    from memgym.data_synth.paths import data_root
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig, run_program_eval

    oracle = data_root() / "longmemeval" / "longmemeval_oracle.json"
    qid = json.loads(oracle.read_text())[0]["question_id"]
    texts = {}  # retrieved characters per budget
    for budget in (None, 64):
        cfg = ProgramEvalConfig(program=str(seed_program_path()), dataset="longmemeval", path=str(oracle),
                                conversations=[qid], extractor="turns", plan_mode="question", validate=False,
                                progress=False, stage_cache="none", context_tokens=budget,
                                out=str(tmp_path / f"b{budget}"))
        (task,) = run_program_eval(cfg).tasks
        texts[budget] = task["retrieved_chars"]
        assert json.loads((tmp_path / f"b{budget}" / "report.json").read_text())["config"]["context_tokens"] == budget
    # the seed program returns the whole history (up to 16,000 characters); 64 tokens of it are a short prefix:
    # at least 64 characters (a token covers >= 1 byte), far shorter than the whole
    assert texts[None] > 1000 and 64 <= texts[64] < texts[None] / 4
    with pytest.raises(ValueError, match="context_tokens"):
        ProgramEvalConfig(program=str(seed_program_path()), context_tokens=0)
