"""Failures that scored 0 silently are counted, reported and said on the console; empty work
exits non-zero (issue 12, findings 4 and 10)."""
from __future__ import annotations

import dataclasses
import json

import pytest

from launch.cli import main as memgym
from llm.embeddings import HashEmbedder
from rewards.evaluate import EvalConfig, run_eval
from llm.runtime import Runtime
from tests.helpers import ScriptedBackend

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
                     answer_model=ANS, scorer="llm", judge_model=JUDGE, out=str(tmp_path / "o"), progress=False)
    rep = run_eval(cfg, _runtime(answer, lambda m, p: "no verdict here"))  # MemBuilder's rule reads no label
    assert rep["n"] == 4 and rep["empty_answers"] == 2 and rep["judge_unparsable"] == 4 and rep["overall"] == 0.0
    md = (tmp_path / "o" / "report.md").read_text()
    assert "| expert:conv-30 | {} | 2 | 4 |" in md


def test_eval_console_names_them_and_an_empty_run_exits_1(tmp_path, capsys, monkeypatch):
    import rewards.evaluate as ev

    monkeypatch.setattr(ev.Runtime, "from_config",
                        classmethod(lambda cls, **kw: _runtime(lambda m, p: "", lambda m, p: "")))
    base = ["eval", "--extractor", "expert:conv-30", "--conversations", "conv-30", "--n_sessions", "2",
            "--answer_model", ANS, "--scorer", "llm", "--judge_model", JUDGE, "--no_progress"]
    assert memgym([*base, "--max_questions", "3", "--out", str(tmp_path / "a")]) == 0
    err = capsys.readouterr().err
    assert "3 judge replies were unreadable by the protocol's rule" in err and "3 answers were empty" in err
    rep_dir = tmp_path / "b"
    orig = ev.load_eval_conversations
    monkeypatch.setattr(ev, "load_eval_conversations",
                        lambda cfg: [dataclasses.replace(c, questions=()) for c in orig(cfg)])
    assert memgym([*base, "--out", str(rep_dir)]) == 1
    assert "0 questions were scored" in capsys.readouterr().err


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


def test_session_reward_counts_unparsable_judge_replies_and_empty_answers():
    from rewards.session_reward import SessionReward, SessionRewardConfig
    from tests.helpers import DOG, WordTokenizer, bank_with, make_samples, qa

    samples = make_samples(bank_with(1, episodic=[DOG]), 2, {},
                           [qa("What is the name of the dog Alice adopted?", "Biscuit"), qa("Who?", "Alice")],
                           managers=["episodic"])
    reward = SessionReward(SessionRewardConfig(judge="llm"), embedder=HashEmbedder(512), tokenizer=WordTokenizer(),
                           answer_backend=ScriptedBackend(["", "Alice"]), judge_backend=ScriptedBackend(["CORRECT"] * 2))
    (b,) = reward(samples, ['{"operations": []}'])
    assert b.acc == 0.0 and reward.last_stats["judge_unparsable"] == 2 and reward.last_stats["empty_answers"] == 1
