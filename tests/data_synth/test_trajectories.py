"""``synth trajectories``: lines in the expert-file format, validated by replay, retried with
the error shown, resumable, stopping a conversation at a session that keeps failing."""
from __future__ import annotations

import json
import re

import pytest

from memgym.data_synth.expert import load_trajectories, replay
from memgym.data_synth.locomo import load_locomo
from memgym.data_synth.paths import expert_dir
from memgym.data_synth.trajectories import synth_trajectories
from memgym.launch.cli import main
from memgym.llm.server import serve_backend
from tests.helpers import ScriptedBackend

pytestmark = pytest.mark.filterwarnings("ignore::memgym.data_synth.errors.DataQuirkWarning")

CONV30 = expert_dir() / "conv-30.jsonl"
EXPERT = {(s.session, m): json.dumps(s.outputs[m]) for s in load_trajectories(CONV30) for m in s.outputs}


def session_and_manager(messages) -> tuple[int, str]:
    user = messages[1]["content"]
    return (int(re.match(r"Session (\d+) date", user).group(1)),
            re.search(r"Now output the JSON for the (\w+) part", user).group(1))


def replaying_expert(messages, params) -> str:
    """Answers each manager prompt with the real expert's output for that session."""
    return EXPERT[session_and_manager(messages)]


@pytest.fixture(scope="module")
def conv30():
    return load_locomo(ids=["conv-30"])[0]


def test_lines_reproduce_the_expert_file_and_carry_qa(tmp_path, conv30):
    out = tmp_path / "traj.jsonl"
    qa = {("conv-30", 2): [{"question": "Where was Jon?", "answer": "Paris", "evidence": ["D2:4"], "kind": "temporal"}]}
    stats = synth_trajectories([conv30], out, backend=ScriptedBackend(replaying_expert), qa=qa, n_sessions=4,
                               progress=False)
    assert stats.sessions_written == 4 and stats.failed == [] and stats.model_calls == 16
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    original = [json.loads(x) for x in CONV30.read_text().splitlines()[:4]]
    assert [x["session"] for x in lines] == [1, 2, 3, 4]
    for got, want in zip(lines, original):
        assert set(got) == {"conversation_id", "session", "date", "core", "episodic", "semantic", "procedural", "qa"}
        assert got["date"] == want["date"]
        for m in ("core", "episodic", "semantic", "procedural"):
            assert got[m] == want[m]
    assert lines[1]["qa"] == qa[("conv-30", 2)] and lines[0]["qa"] == []
    assert replay(out).dumps() == replay(CONV30, upto_session=4).dumps()


def test_invalid_output_is_retried_with_the_error_shown(tmp_path, conv30):
    def expert(messages, params):
        sess, m = session_and_manager(messages)
        if (sess, m) == (2, "episodic") and len(messages) == 2:
            return '{"operations": [{"action": "UPDATE", "id": "E99", "memory": "x"}]}'
        if (sess, m) == (2, "core") and len(messages) == 2:
            return json.dumps({"operation": "APPEND", "content": "x" * 6000})
        return EXPERT[(sess, m)]

    backend = ScriptedBackend(expert)
    out = tmp_path / "traj.jsonl"
    stats = synth_trajectories([conv30], out, backend=backend, n_sessions=2, progress=False)
    assert stats.sessions_written == 2 and stats.retries == 2
    assert dict(stats.invalid) == {"unknown_id": 1, "core_over_limit": 1}
    retry = [m for m, _ in backend.seen if len(m) == 4]
    assert len(retry) == 2  # core then episodic, each with its previous output and the error
    assert retry[0][2]["content"].startswith('{"operation": "APPEND"') and "over the 5000 limit" in retry[0][3]["content"]
    assert "id E99 is not in episodic" in retry[1][3]["content"]
    assert replay(out).dumps() == replay(CONV30, upto_session=2).dumps()


def test_failing_session_stops_the_conversation_and_a_rerun_resumes(tmp_path, conv30):
    def flaky(messages, params):
        sess, m = session_and_manager(messages)
        return "I cannot do that." if (sess, m) == (3, "semantic") else EXPERT[(sess, m)]

    out = tmp_path / "traj.jsonl"
    stats = synth_trajectories([conv30], out, backend=ScriptedBackend(flaky), n_sessions=5, max_tries=2,
                               progress=False)
    assert stats.sessions_written == 2
    assert stats.failed == [{"conversation_id": "conv-30", "session": 3, "managers": ["semantic"],
                             "errors": {"semantic": stats.failed[0]["errors"]["semantic"]}}]
    assert stats.failed[0]["errors"]["semantic"].startswith("parse_error")
    assert stats.invalid == {"parse_error": 2}
    assert [json.loads(x)["session"] for x in out.read_text().splitlines()] == [1, 2]
    good = ScriptedBackend(replaying_expert)
    stats2 = synth_trajectories([conv30], out, backend=good, n_sessions=5, progress=False)
    assert (stats2.sessions_resumed, stats2.sessions_written, good.calls) == (2, 3, 12)
    assert replay(out).dumps() == replay(CONV30, upto_session=5).dumps()


def test_cli_trajectories_over_an_openai_server(tmp_path, capsys):
    server, _, url = serve_backend(ScriptedBackend(replaying_expert, model_id="fake"))
    out = tmp_path / "t.jsonl"
    try:
        rc = main(["synth", "trajectories", "--expert", f"openai:{url}#fake", "--conversations", "conv-30",
                   "--n-sessions", "2", "--embedder", "hash:256", "--cache", "none", "--out", str(out), "--quiet"])
        assert main(["synth", "trajectories", "--expert", f"openai:{url}#fake", "--split", "test",
                     "--out", str(out)]) == 2
    finally:
        server.shutdown()
        server.server_close()
    assert rc == 0
    summary = json.loads((tmp_path / "t.jsonl.summary.json").read_text())
    assert summary["sessions_written"] == 2 and summary["runtime"]["calls"]["expert"] == 8
    assert replay(out).dumps() == replay(CONV30, upto_session=2).dumps()
