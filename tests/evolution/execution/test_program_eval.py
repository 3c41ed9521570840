"""Tests of :mod:`evolution.execution.program_eval`."""
from __future__ import annotations
import json
from launch.cli import main as memgym
import shutil
from pathlib import Path
from data_synth.paths import data_root


def test_program_eval_where_every_retrieve_fails_exits_1(tmp_path, capsys, monkeypatch):
    from memory_bank.programs import read_program_source, seed_program_path

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


def _beam_chat(tmp_path: Path, chat=None, questions=None) -> Path:
    src = data_root() / "beam" / "100K" / "3"
    dst = tmp_path / "beam" / "100K" / "3"
    shutil.copytree(src, dst)
    if chat is not None:
        (dst / "chat.json").write_text(json.dumps(chat))
    if questions is not None:
        (dst / "probing_questions" / "probing_questions.json").write_text(json.dumps(questions))
    return dst


def test_program_eval_on_a_beam_folder_defaults_to_its_chats(tmp_path):
    from memory_bank.programs import seed_program_path

    folder = _beam_chat(tmp_path)
    out = tmp_path / "pe"
    rc = memgym(["program", "eval", str(seed_program_path()), "--dataset", "beam", "--path", str(folder),
                 "--n_sessions", "1", "--max_questions", "2", "--extractor", "turns", "--plan_mode", "question",
                 "--scorer", "rubric-recall", "--no_diagnostics", "--no_validate", "--stage_cache", "none",
                 "--cache", str(tmp_path / "r.sqlite"), "--no_progress", "--out", str(out)])
    assert rc == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["config"]["conversations"] == ["100K-3"] and rep["n"] == 2
