"""Issue 19, section 2, findings 1-7: ``memgym evolve`` under bad input (folders, failed starts,
damaged run state, edited recipes, retry settings, a dead coder, two processes on one run)."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.api import build_runtime
from memgym.launch.cli import main, main as memgym

ROOT = Path(__file__).resolve().parents[2]
ARGS = ["--train", "conv-26", "--valid", "conv-30", "--test", "", "--n_sessions", "2", "--max_questions", "6",
        "--extractor", "turns", "--rounds_integrate", "0", "--plan_mode", "question", "--scorer", "answer-recall",
        "--embedder", "hash:256", "--no_progress", "--proposer", "params", "--rounds_cold", "1", "--rounds_refine", "0"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("evo") / "run"
    assert memgym(["evolve", *ARGS, "--out", str(out)]) == 0
    return out


def _copy(run: Path, tmp_path: Path) -> Path:
    dst = tmp_path / "copy"
    shutil.copytree(run, dst)
    return dst


def _one_line_error(capsys) -> str:
    err = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("warning: ")]
    assert len(err) == 1 and "Traceback" not in err[0], err
    return err[0]


def test_the_summary_carries_the_run_card(finished_run, capsys):
    s = json.loads((finished_run / "summary.json").read_text())
    card = s["run_card"]
    assert card["command"] == ["memgym", "evolve", *ARGS, "--out", str(finished_run)]
    assert card["seeds"] == {"seed": 0} and card["wall_s"] == s["wall_s"] and card["recipe"]["rounds_cold"] == 1
    assert card["models"]["extractor"]["model"] is None and card["models"]["embedder"]["spec"] == "hash-256"
    assert card["models"]["task_model"] == {"spec": "hf:smollm2", "used": False}
    assert card["cost"]["calls"] == s["model_calls"]
    assert {"locomo/locomo10.json", "memory_bank/programs/seed.py"} <= {e.get("rel") for e in card["inputs"]}
    assert "## Run card" in (finished_run / "report.md").read_text()
    capsys.readouterr()
    assert memgym(["reproduce", str(finished_run), "--check"]) == 0
    assert "inputs and environment: the same as recorded" in capsys.readouterr().out


def test_f1_a_folder_with_files_and_no_run_is_refused(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "report.md").write_text("my notes")
    (out / "best.py").write_text("x = 1\n")
    assert memgym(["evolve", *ARGS, "--out", str(out)]) == 2
    assert _one_line_error(capsys) == (f"memgym evolve: {out} holds files but no memgym evolve run (best.py, report.md); "
                                       "a run would overwrite report.md, best.py, summary.json and others there: "
                                       "choose a new or empty folder")
    assert sorted(p.name for p in out.iterdir()) == ["best.py", "report.md"]
    assert (out / "report.md").read_text() == "my notes"


def test_f2_a_failed_fresh_start_leaves_nothing_and_the_corrected_command_runs(tmp_path, capsys):
    out = tmp_path / "run"
    assert memgym(["evolve", *ARGS, "--out", str(out), "--cache", "/dev/null/responses.sqlite"]) == 1  # an OSError
    assert "/dev/null" in _one_line_error(capsys)
    assert not out.exists()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert memgym(["evolve", *ARGS, "--out", str(empty), "--seed_program", str(tmp_path / "missing.py")]) == 2
    assert sorted(p.name for p in empty.iterdir()) == []  # no recipe.json, no sqlite files, no seed.py
    assert memgym(["evolve", *ARGS, "--out", str(out)]) == 0
    assert json.loads((out / "state.json").read_text())["next_round"] == 2


def _damage(kind: str, st: dict, text: str) -> str:
    if kind == "missing_key":
        del st["history"]
    elif kind == "a_list":
        return json.dumps([st])
    elif kind == "null_field":
        st["next_round"] = None
    elif kind == "null_archive":
        st["archive"] = None
    elif kind == "archive_missing_candidates":
        st["archive"]["candidates"] = []
    elif kind == "history_names_a_lost_candidate":
        st["archive"]["candidates"] = [c for c in st["archive"]["candidates"] if c["id"] != "r01"]
    elif kind == "truncated":
        return text[: len(text) // 2]
    return json.dumps(st)


@pytest.mark.parametrize("kind, message", [
    ("missing_key", "damaged run state: key 'history' is missing"),
    ("a_list", "damaged run state: a JSON object expected, got list"),
    ("null_field", "damaged run state: 'next_round' is NoneType, not int"),
    ("null_archive", "damaged run state: 'archive' is NoneType, not dict"),
    ("archive_missing_candidates", "damaged run state: the archive names candidates it does not hold: r01, seed"),
    ("history_names_a_lost_candidate", "damaged run state: the archive names candidates it does not hold: r01"),
    ("truncated", "damaged JSON at line "),
])
def test_f3_a_damaged_state_is_one_line_naming_the_file(finished_run, tmp_path, capsys, kind, message):
    run = _copy(finished_run, tmp_path)
    text = (run / "state.json").read_text()
    (run / "state.json").write_text(_damage(kind, json.loads(text), text))
    assert memgym(["evolve", "--resume", str(run)]) == 2
    line = _one_line_error(capsys)
    assert line.startswith(f"memgym evolve: {run / 'state.json'}: {message}"), line


def test_f3_a_damaged_recipe_names_the_file(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    (run / "recipe.json").write_text('{"train": ["conv-26"')
    assert memgym(["evolve", "--resume", str(run)]) == 2
    assert _one_line_error(capsys).startswith(f"memgym evolve: {run / 'recipe.json'}: damaged JSON at line 1")


def test_f4_an_edited_recipe_is_refused_on_resume(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    rec = json.loads((run / "recipe.json").read_text())
    rec["valid"] = ["conv-41"]
    (run / "recipe.json").write_text(json.dumps(rec))
    before = (run / "state.json").read_bytes()
    assert memgym(["evolve", "--resume", str(run)]) == 2
    assert _one_line_error(capsys) == (
        f"memgym evolve: {run / 'recipe.json'} does not match the run stored in {run / 'state.json'} (valid: "
        "['conv-30'] in the run, ['conv-41'] in recipe.json); restore the recipe or start a new run in another folder")
    assert (run / "state.json").read_bytes() == before
    rec["valid"] = ["conv-30"]
    (run / "recipe.json").write_text(json.dumps(rec))
    assert memgym(["evolve", "--resume", str(run), "--no_progress"]) == 0  # the original recipe resumes


def test_f5_the_hash_embedder_runtime_keeps_the_request_settings(tmp_path):
    cfg = EvolveConfig(train=["conv-26"], valid=["conv-30"], test=[], n_sessions=1, extractor="turns",
                       plan_mode="question", scorer="answer-recall", embedder="hash:64", request_retries=1,
                       request_timeout_s=7.0, progress=False, out=str(tmp_path / "run"))
    rt = build_runtime(cfg, tmp_path / "run")
    assert rt.request_options == {"timeout_s": 7.0, "max_retries": 1}
    assert type(rt.embedder).__name__ == "HashEmbedder" and rt.embedder.dim == 64


def _evolve_against_a_dead_coder(tmp_path, rounds: int):
    """``memgym evolve`` with the coder proposer pointed at a port nothing listens on, ``rounds``
    cold rounds: (exit status, the endpoint URL, the run folder)."""
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    out = tmp_path / "run"
    args = [a for a in ARGS]
    args[args.index("--proposer") + 1] = "coder"
    args[args.index("--rounds_cold") + 1] = str(rounds)
    rc = memgym(["evolve", *args, "--coder_model", f"openai:{url}#coder", "--request_retries", "0",
                 "--out", str(out)])
    return rc, url, out


def test_f6_an_unreachable_coder_stops_the_run_non_zero_naming_the_url(tmp_path, capsys):
    rc, url, out = _evolve_against_a_dead_coder(tmp_path, 6)
    assert rc == 1
    line = _one_line_error(capsys)
    assert line.startswith("memgym evolve: stopped after 3 consecutive rounds whose model requests failed; last: "
                           f"coder call failed: BackendRequestError: OpenAIBackend: request to {url} ")
    assert line.endswith("Fix the server (or the coder_model URL), then continue with --resume")
    st = json.loads((out / "state.json").read_text())
    status = {c["id"]: c["status"] for c in st["archive"]["candidates"]}  # the history's candidates
    assert st["next_round"] == 4 and [status[h["candidate"]] for h in st["history"]] == ["evaluated", "failed",
                                                                                       "failed", "failed"]


def test_a_coder_endpoint_that_fails_every_round_exits_nonzero_with_the_run_written(tmp_path, capsys):
    """Two rounds, both proposals failed on the dead endpoint (fewer than the 3 that stop a run):
    the run is written (the seed frozen), and the command says so and exits 1, not 0."""
    rc, url, out = _evolve_against_a_dead_coder(tmp_path, 2)
    assert rc == 1
    line = _one_line_error(capsys)
    assert line.startswith("memgym evolve: every proposal of the 2 round(s) failed because the coder endpoint failed, so "
                           "nothing was evolved (the seed is the frozen program); last: coder call failed: "
                           f"BackendRequestError: OpenAIBackend: request to {url} ")
    assert line.endswith(f"The run directory {out} is written; fix the server (or the coder_model URL) and start a "
                         "new run")
    s = json.loads((out / "summary.json").read_text())
    assert s["final_id"] == "seed" and s["rounds"] == 2 and s["proposals_failed"] == 2
    assert (out / "best.py").read_text() == (out / "seed.py").read_text() and (out / "report.md").exists()
    assert memgym(["evolve", "--resume", str(out), "--no_progress"]) == 1  # resuming the finished run says it again
    assert _one_line_error(capsys) == line


def test_f7_a_second_process_on_the_same_run_is_refused(finished_run, tmp_path, capsys):
    run = _copy(finished_run, tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; sys.path.insert(0, sys.argv[1]); "
         "from memgym.evolution.search.rundir import run_lock\nwith run_lock(sys.argv[2]):\n print('held', flush=True); "
         "time.sleep(120)", str(ROOT), str(run)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        before = (run / "state.json").read_bytes()
        assert memgym(["evolve", "--resume", str(run)]) == 2
        assert _one_line_error(capsys) == (f"memgym evolve: another memgym process (pid {holder.pid}) is working in "
                                           f"{run}; wait for it to end or stop it first")
        assert (run / "state.json").read_bytes() == before
    finally:
        holder.kill()
        holder.wait()
    assert memgym(["evolve", "--resume", str(run), "--no_progress"]) == 0  # the lock died with its holder


def test_evolve_bad_ids_leave_no_run_behind(tmp_path, capsys):
    out = tmp_path / "run"
    argv = ["evolve", "--config", "launch/recipes/evolve_locomo_offline.yaml", "--train", "conv-99",
            "--out", str(out), "--embedder", "hash:64", "--no_progress"]
    assert main(argv) == 2
    assert "conv-99" in capsys.readouterr().err
    assert not (out / "recipe.json").exists()  # the corrected command is not told "already holds a run"
    assert main(["evolve", "--resume", str(out)]) == 2
    assert "recipe.json is missing" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["--resume"], ["--resume", "--no_progress"]])
def test_resume_without_a_run_directory_is_one_line(argv, capsys):
    assert memgym(["evolve", *argv]) == 2  # argparse's error, raised as a ConfigError
    assert capsys.readouterr().err.strip() == "memgym evolve: argument --resume: expected one argument"


def test_help_lists_resume(capsys):
    """``--resume`` is an argument of the evolve parser in the command tree."""
    with pytest.raises(SystemExit) as exit_:
        memgym(["evolve", "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "[--resume DIR]" in out
    assert "continue the run in DIR with the recipe stored there" in " ".join(out.split())
