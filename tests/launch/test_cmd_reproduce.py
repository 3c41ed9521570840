"""The run card in reports and ``memgym reproduce``: the card of a small ``memgym program eval``
run, a data file edited in a copy of ``$MEMGYM_DATA`` found before anything runs, and reruns of
a ``memgym eval`` report to the same (and, after a gold answer changed, different) scores."""
from __future__ import annotations

import hashlib
import json
import os
import platform
import shutil
from importlib.metadata import version

import pytest

from memgym.data_synth.paths import data_root
from memgym.launch.cli import main as memgym
from memgym.memory_bank.programs import seed_program_path

SHARED = data_root()  # the real data folder (tests point $MEMGYM_DATA at a copy of parts of it)

#: The cheapest program evaluation: no model, no embedder call, the first 3 questions of
#: conv-30's first session (answer-recall 1, 0, 0 with the seed program).
PROGRAM_EVAL = ["program", "eval", str(seed_program_path()), "--conversations", "conv-30", "--n_sessions", "1",
                "--max_questions", "3", "--extractor", "turns", "--scorer", "answer-recall", "--plan_mode", "question",
                "--no_diagnostics", "--no_validate", "--no_progress", "--stage_cache", "none", "--cache", "none"]


def _sha(path) -> str:
    return hashlib.sha256(open(path, "rb").read()).hexdigest()


@pytest.fixture
def data_copy(tmp_path, monkeypatch):
    """``$MEMGYM_DATA`` pointed at a copy holding LoCoMo only."""
    root = tmp_path / "data"
    (root / "locomo").mkdir(parents=True)
    shutil.copy(SHARED / "locomo" / "locomo10.json", root / "locomo" / "locomo10.json")
    monkeypatch.setenv("MEMGYM_DATA", str(root))
    return root


def test_the_run_card_of_a_program_eval(tmp_path, data_copy):
    import subprocess

    out = tmp_path / "pe"
    argv = [*PROGRAM_EVAL, "--out", str(out)]
    assert memgym(argv) == 0
    rep = json.loads((out / "report.json").read_text())
    card = rep["run_card"]
    assert rep["overall"] == pytest.approx(1 / 3) and rep["n"] == 3
    assert card["command"] == ["memgym", *argv] and card["cwd"] == os.getcwd()
    head = subprocess.run(["git", "-C", os.path.dirname(os.path.dirname(__file__)), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    assert card["memgym"]["commit"] == head and card["memgym"]["version"] == "0.1.0"
    assert card["packages"]["python"] == platform.python_version()
    for name in ("torch", "transformers", "trl", "sentence-transformers"):
        assert card["packages"][name] == version(name)
    locomo = data_copy / "locomo" / "locomo10.json"
    assert card["inputs"] == [
        {"path": str(seed_program_path()), "kind": "memory program", "base": "memgym",
         "rel": "memory_bank/programs/seed.py", "sha256": _sha(seed_program_path()),
         "bytes": seed_program_path().stat().st_size},
        {"path": str(locomo), "kind": "LoCoMo file", "base": "MEMGYM_DATA", "rel": "locomo/locomo10.json",
         "sha256": _sha(locomo), "bytes": locomo.stat().st_size}]
    assert card["models"]["extractor"] == {"spec": "turns", "model": None,
                                           "note": "no model: every dialogue turn is a unit"}
    assert card["models"]["task_model"] == {"spec": "hf:smollm2", "used": False}  # answer-recall answers nothing
    assert card["judge"] == {"scorer": "answer-recall", "judge_protocol": "official", "file": None, "sha256": None}
    assert card["recipe"] == rep["config"] and card["seeds"] == {} and card["wall_s"] == rep["wall_s"]
    assert card["cost"] == {"calls": rep["model_calls"], "tokens": rep["tokens"]} and card["cost"]["tokens"] == {}
    assert card["machine"]["cores"] == os.cpu_count() and card["env"]["MEMGYM_DATA"] == str(data_copy)
    md = (out / "report.md").read_text()
    assert "## Run card" in md and f"`memgym {' '.join(argv)}`" in md and "`locomo/locomo10.json` " in md


def test_reproduce_check_names_an_edited_data_file_before_running(tmp_path, data_copy, capsys):
    out = tmp_path / "pe"
    assert memgym([*PROGRAM_EVAL, "--out", str(out)]) == 0
    capsys.readouterr()
    assert memgym(["reproduce", str(out), "--check"]) == 0
    assert "inputs and environment: the same as recorded" in capsys.readouterr().out
    f = data_copy / "locomo" / "locomo10.json"
    before = _sha(f)
    f.write_bytes(f.read_bytes() + b"\n")  # the same data to a JSON parser, another file
    assert memgym(["reproduce", str(out / "report.json"), "--check"]) == 0  # reported, not an error
    text = capsys.readouterr().out
    assert (f"differs: input locomo/locomo10.json (LoCoMo file) at {f}: recorded {before[:12]}, now {_sha(f)[:12]}"
            in text) and "inputs and environment: 1 differ" in text
    assert memgym(["reproduce", str(out), "--check", "--strict"]) == 1
    assert memgym(["reproduce", str(out), "--strict"]) == 1  # nothing reruns
    assert "--strict: not rerunning" in capsys.readouterr().out and not (tmp_path / "pe-reproduce").exists()


def _gold_set(path, qid_question: str, answer: str) -> None:
    data = json.loads(path.read_text())
    conv = next(r for r in data if r["sample_id"] == "conv-30")
    qa = next(q for q in conv["qa"] if q["question"] == qid_question)
    qa["answer"] = answer
    path.write_text(json.dumps(data))


def test_reproduce_reruns_an_eval_to_the_same_scores_and_names_a_score_that_moved(tmp_path, data_copy, capsys):
    (data_copy / "expert").mkdir()
    shutil.copy(SHARED / "expert" / "conv-30.jsonl", data_copy / "expert" / "conv-30.jsonl")
    out = tmp_path / "ev"
    argv = ["eval", "--extractor", "expert:conv-30", "--compare", "none", "--conversations", "conv-30",
            "--n_sessions", "1", "--max_questions", "2", "--scorer", "answer-recall", "--no_progress",
            "--cache", "none", "--stage_cache", "none", "--out", str(out)]
    assert memgym(argv) == 0
    rep = json.loads((out / "report.json").read_text())
    traj = data_copy / "expert" / "conv-30.jsonl"
    assert rep["run_card"]["models"]["extractor"]["files"] == {str(traj): _sha(traj)}
    assert rep["run_card"]["models"]["embedder"]["spec"] == "minilm"
    capsys.readouterr()

    assert memgym(["reproduce", str(out / "report.json"), "--out", str(tmp_path / "again")]) == 0
    text = capsys.readouterr().out
    assert "inputs and environment: the same as recorded" in text
    assert f"  expert:conv-30: overall: {rep['overall']:.4f} = {rep['overall']:.4f}" in text and "reproduced" in text
    again = json.loads((tmp_path / "again" / "report.json").read_text())
    assert again["run_card"]["command"][-2:] == ["--out", str(tmp_path / "again")]
    assert again["overall"] == rep["overall"] and again["overall_recall"] == rep["overall_recall"]

    # a gold answer the memory held becomes one it never heard of: the rerun's score drops
    preds = [json.loads(x) for x in (out / "predictions.jsonl").read_text().splitlines()]
    hit = next(p for p in preds if p["score"] > 0)
    _gold_set(data_copy / "locomo" / "locomo10.json", hit["question"], "zzyzx qwertyuiop")
    assert memgym(["reproduce", str(out), "--out", str(tmp_path / "moved")]) == 1
    text = capsys.readouterr().out
    assert "differs: input locomo/locomo10.json (LoCoMo file)" in text
    line = next(x for x in text.splitlines() if x.startswith("  expert:conv-30: overall:"))
    assert line.endswith("DIFFERS") and f"{rep['overall']} != " in line


def test_reproduce_refuses_a_report_without_a_card_and_a_foreign_command(tmp_path, capsys):
    (tmp_path / "report.json").write_text(json.dumps({"overall": 0.5}))
    assert memgym(["reproduce", str(tmp_path)]) == 2
    assert "holds no run card" in capsys.readouterr().err
    card = {"command": ["python", "my_script.py"], "memgym": {}, "packages": {}, "inputs": [], "models": {},
            "machine": {}, "recipe": {}}
    (tmp_path / "report.json").write_text(json.dumps({"overall": 0.5, "run_card": card}))
    assert memgym(["reproduce", str(tmp_path)]) == 2
    assert "is not a memgym command line" in capsys.readouterr().err


def test_rerun_argv_replaces_the_output_flag_and_restarts_a_resumed_evolve(tmp_path):
    from memgym.launch.cmd_reproduce import rerun_argv

    card = {"command": ["memgym", "train", "sft", "--config", "r.yaml", "--output_dir", "runs/a", "--seed", "1"]}
    assert rerun_argv(card, tmp_path / "b", False, tmp_path) == ["train", "sft", "--config", "r.yaml", "--seed", "1",
                                                                 "--output_dir", str(tmp_path / "b")]
    card = {"command": ["memgym", "score", "--out=x", "--dataset", "locomo"]}
    assert rerun_argv(card, tmp_path / "b", True, tmp_path) == ["score", "--dataset", "locomo", "--cache", "none",
                                                                "--out", str(tmp_path / "b")]
    card = {"command": ["memgym", "evolve", "--resume", "runs/evo"], "recipe": {"seed": 2, "out": "runs/evo"}}
    argv = rerun_argv(card, tmp_path / "b", False, tmp_path)
    assert argv == ["evolve", "--config", str(tmp_path / "recipe.yaml"), "--out", str(tmp_path / "b")]
    assert (tmp_path / "recipe.yaml").read_text() == "seed: 2\n"


def test_headlines_of_each_report_kind():
    from memgym.launch.cmd_reproduce import compare_headlines, headline

    scores = {"overall": 0.5, "by_capability": {"F": {"score": 1.0, "n": 1}}}
    summary = {"final_id": "r3", "seed": {"valid": {"overall": 0.3}, "test": None},
               "final": {"valid": {"overall": 0.6, "by_capability": {"F": 0.7}}, "test": {"overall": 0.55}},
               "baselines": {"bm25": {"valid": {"overall": 0.4}, "test": None}}}
    assert headline("summary.json", summary) == {"frozen program": "r3", "seed valid overall": 0.3,
                                                 "final valid overall": 0.6, "final valid F": 0.7,
                                                 "final test overall": 0.55, "baseline bm25 valid overall": 0.4}
    assert headline("report.json", {"extractor": "e", "answer_model": "m", "column": "e", **scores,
                                    "compare": {"x": {"overall": 0.25}}}) == \
        {"e: overall": 0.5, "e: F": 1.0, "x: overall": 0.25}
    state = {"global_step": 4, "log_history": [{"loss": 2.0, "step": 1}, {"memory_eval/heldout_entries": 3.0},
                                               {"loss": 1.5, "step": 4}]}
    assert headline("trainer_state.json", state) == {"global_step": 4, "loss": 1.5, "memory_eval/heldout_entries": 3.0}
    lines = compare_headlines({"a": 0.5, "b": float("nan")}, {"a": 0.5000001, "b": float("nan")}, 0.0)
    assert lines == ["  a: 0.5 != 0.5000001   DIFFERS", "  b: nan = nan"]
    assert compare_headlines({"a": 0.5}, {"a": 0.5000001}, 1e-6) == ["  a: 0.5000 = 0.5000"]


def test_the_run_card_of_score_names_the_judge_file_and_server_and_reproduces(tmp_path, capsys):
    from memgym.llm.server import serve_backend
    from tests.helpers import ScriptedBackend

    judge = ScriptedBackend(lambda m, p: "yes" if "over a year" in m[0]["content"] else "no")
    server, _, url = serve_backend(judge, served_model_name="judge")
    preds = tmp_path / "h.jsonl"
    preds.write_text("".join(json.dumps(r) + "\n" for r in [{"question_id": "001be529", "hypothesis": "over a year"},
                                                             {"question_id": "0862e8bf_abs", "hypothesis": "no idea"}]))
    out = tmp_path / "scored"
    try:
        assert memgym(["score", "--dataset", "longmemeval", "--split", "test", "--predictions", str(preds),
                       "--judge", f"openai:{url}#judge", "--cache", "none", "--allow_partial", "--out", str(out)]) == 0
        s = json.loads((out / "scores.json").read_text())
        card = s["run_card"]
        protocol = SHARED / "judges" / "longmemeval.json"
        assert card["judge"] == {"scorer": "llm", "judge_protocol": "official", "file": str(protocol),
                                 "sha256": _sha(protocol)}
        assert card["models"] == {"judge": {"spec": f"openai:{url}#judge", "servers": [{"url": url, "id": "judge"}]}}
        assert {e.get("rel", e["path"]): e["kind"] for e in card["inputs"]} == {
            "longmemeval/splits.json": "LongMemEval splits file", "longmemeval/longmemeval_oracle.json":
            "LongMemEval file", "judges/longmemeval.json": "judge protocol", str(preds): "predictions"}
        assert card["cost"]["calls"]["judge"] == 2 == judge.calls and card["recipe"]["judge"] == f"openai:{url}#judge"
        assert "## Run card" in (out / "report.md").read_text()
        capsys.readouterr()
        assert memgym(["reproduce", str(out)]) == 0 and judge.calls == 4  # judged again, to the same scores
        text = capsys.readouterr().out
        assert "  overall: 0.5000 = 0.5000" in text and "inputs and environment: the same as recorded" in text
        assert json.loads((tmp_path / "scored-reproduce" / "scores.json").read_text())["overall"] == s["overall"]
    finally:
        server.shutdown()
        server.server_close()
