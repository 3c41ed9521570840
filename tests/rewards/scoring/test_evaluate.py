"""End to end: ``memgym eval`` on 2 real LoCoMo sessions with a tiny random-weight model, and
(slow) with the embedded SmolLM2."""
from __future__ import annotations

import dataclasses
import json

import pytest

from memgym.launch.cli import main as memgym
from memgym.llm.embeddings import HashEmbedder
from memgym.llm.runtime import Runtime
from memgym.evolution.evaluation.eval_job import EvalConfig, run_eval
from tests.helpers import ScriptedBackend


def _recipe(tmp_path, extractor, **extra):
    lines = [
        "dataset: locomo", "conversations: [conv-30]", "n_sessions: 2",
        f"extractor: {extractor}", f"task_model: {extra.pop('task_model', extractor)}",
        "scorer: f1", "extractor_max_new_tokens: 24", "answer_max_new_tokens: 8",
        "batch_size: 4", f"cache: {tmp_path / 'responses.sqlite'}", "progress: false",
        f"stage_cache: {tmp_path / 'stages.sqlite'}",
    ] + [f"{k}: {v}" for k, v in extra.items()]
    p = tmp_path / "recipe.yaml"
    p.write_text("# test recipe\n" + "\n".join(lines) + "\n")
    return p


def test_eval_tiny_model_two_sessions(tmp_path, tiny_model_dir, capsys):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, f"hf:{tiny_model_dir}", max_questions=6)
    assert memgym(["eval", "--recipe", str(recipe), "--compare", "expert:conv-30", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    # conv-30's first 2 sessions hold 22 QA with all evidence inside; the recipe caps at 6
    assert rep["n"] == 6 and rep["compare"]["expert:conv-30"]["n"] == 6
    assert set(rep["format_failure_rate"]) == {"core", "episodic", "semantic", "procedural"}
    # a random-weight model never writes valid JSON: every manager output is a format failure
    assert rep["format_failure_rate"] == {"core": 1.0, "episodic": 1.0, "semantic": 1.0, "procedural": 1.0}
    assert rep["compare"]["expert:conv-30"]["format_failure_rate"]["semantic"] == 0.0
    # 2 sessions x 4 managers extractor calls + 6 answers, for each extractor column
    assert rep["model_calls"]["extractor"] == 8 and rep["model_calls"]["answer"] == 6
    assert rep["compare"]["expert:conv-30"]["model_calls"].get("extractor", 0) == 0
    assert sum(v["n"] for v in rep["by_category"].values()) == 6
    assert (out / "report.md").read_text().count("expert:conv-30") >= 2
    assert (out / "by_category.png").stat().st_size > 1000
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 12
    printed = capsys.readouterr().out
    assert "| category | n |" in printed and "expert:conv-30" in printed

    # a repeated run is served by the response cache: no model call at all
    out2 = tmp_path / "run2"
    assert memgym(["eval", "--config", str(recipe), "--out", str(out2)]) == 0
    rep2 = json.loads((out2 / "report.json").read_text())
    assert rep2["model_calls"].get("extractor", 0) == 0 and rep2["model_calls"].get("answer", 0) == 0
    assert rep2["overall"] == rep["overall"]


def test_eval_bad_recipe_is_a_clear_error(tmp_path, capsys):
    p = tmp_path / "r.yaml"
    p.write_text("dataset: locomo\nno_such_field: 1\n")
    assert memgym(["eval", "--recipe", str(p)]) == 2
    assert "no_such_field" in capsys.readouterr().err


@pytest.mark.slow
def test_eval_smollm2_one_session(tmp_path, smollm2_dir):
    out = tmp_path / "run"
    recipe = _recipe(tmp_path, "hf:smollm2", max_questions=3, n_sessions=1)
    recipe.write_text(recipe.read_text().replace("n_sessions: 2\n", ""))
    assert memgym(["eval", "--recipe", str(recipe), "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    # conv-30 session 1 with its first 3 QA: one call per manager, one per question
    assert rep["n"] == 3 and rep["model_calls"] == {"extractor": 4, "answer": 3, "embed": 0}
    # 24 tokens cannot hold a manager's JSON: every output hits the cap (4 x 24 tokens), fails
    # to parse, and the bank stays empty; each greedy answer runs to its 8-token cap
    assert rep["tokens"]["extractor"]["completion"] == 96 and rep["tokens"]["answer"]["completion"] == 24
    assert rep["format_failure_rate"] == {"core": 1.0, "episodic": 1.0, "semantic": 1.0, "procedural": 1.0}
    # nothing retrieved, so the answer has no memory to go on: F1 0 and recall 0 for all three
    preds = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [p["retrieved"] for p in preds] == [{"episodic": 0, "semantic": 0, "procedural": 0}] * 3
    assert [p["gold"] for p in preds] == ["19 January, 2023", "January, 2023", "by dancing"]
    assert [(p["score"], p["recall"]) for p in preds] == [(0.0, 0.0)] * 3
    assert (rep["overall"], rep["overall_recall"]) == (0.0, 0.0)


ANS = "openai:http://answer.invalid/v1#a"


JUDGE = "openai:http://judge.invalid/v1#j"


def _runtime(answer, judge):
    rt = Runtime(embedder=HashEmbedder(64))
    rt.register(ANS, ScriptedBackend(answer, model_id="a"))
    rt.register(JUDGE, ScriptedBackend(judge, model_id="j"))
    return rt


def test_unparsable_judge_replies_and_empty_answers_are_counted(tmp_path):
    n = {"k": 0}

    def answer(m, p):
        n["k"] += 1
        return "" if n["k"] % 2 else "Paris"

    cfg = EvalConfig(extractor="expert:conv-30", conversations=["conv-30"], n_sessions=2, max_questions=4,
                     task_model=ANS, scorer="llm", judge_model=JUDGE, out=str(tmp_path / "o"), progress=False,
                     stage_cache="none")
    rep = run_eval(cfg, _runtime(answer, lambda m, p: "no verdict here"))  # MemBuilder's rule reads no label
    assert rep["n"] == 4 and rep["empty_answers"] == 2 and rep["judge_unparsable"] == 4 and rep["overall"] == 0.0
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| expert:conv-30 | {} | 2 | 4 |" in md


def test_eval_console_names_them_and_an_empty_run_exits_1(tmp_path, capsys, monkeypatch):
    import memgym.evolution.evaluation.eval_job as ev

    monkeypatch.setattr(ev.Runtime, "from_config",
                        classmethod(lambda cls, **kw: _runtime(lambda m, p: "", lambda m, p: "")))
    base = ["eval", "--extractor", "expert:conv-30", "--conversations", "conv-30", "--n_sessions", "2",
            "--task_model", ANS, "--scorer", "llm", "--judge_model", JUDGE, "--no_progress",
            "--stage_cache", "none"]  # scripted backends share a spec across tests: no stage reuse between them
    assert memgym([*base, "--max_questions", "3", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "3 judge replies were unreadable by the protocol's rule" in err and "3 answers were empty" in err
    rep_dir = tmp_path / "b"
    orig = ev.load_selected
    monkeypatch.setattr(ev, "load_selected",
                        lambda cfg: [dataclasses.replace(c, questions=()) for c in orig(cfg)])
    assert memgym([*base, "--out", str(rep_dir)]) == 1
    assert "0 questions were scored" in capsys.readouterr().err


def test_eval_is_a_program_evaluation_of_the_bank(tmp_path, tiny_model_dir):
    """`memgym eval` of a column = `memgym program eval memory_bank/programs/bank.py` with that
    extractor and the question as the query: the same answers and F1, question by question."""
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig, run_program_eval
    from memgym.memory_bank.programs import bank_program_path

    common = dict(dataset="locomo", conversations=["conv-30"], n_sessions=2, max_questions=6,
                  extractor="expert:conv-30", task_model=f"hf:{tiny_model_dir}", scorer="f1",
                  answer_max_new_tokens=8, batch_size=4, cache=str(tmp_path / "responses.sqlite"),
                  stage_cache="none", progress=False)
    rep = run_eval(EvalConfig(**common, out=str(tmp_path / "eval")))
    ev = run_program_eval(ProgramEvalConfig(**common, plan_mode="question", program=str(bank_program_path()),
                                            out=str(tmp_path / "program_eval")))
    assert rep["n"] == ev.n == 6
    by_id = {r["id"]: r for r in ev.tasks}
    assert {p["id"]: (p["prediction"], p["score"]) for p in rep["predictions"]} == \
        {i: (r["prediction"], r["score"]) for i, r in by_id.items()}
    assert rep["overall"] == ev.overall and rep["by_category"] == ev.by_category
