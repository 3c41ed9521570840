"""``memgym synth qa`` killed with SIGKILL mid-run, then re-run: one line per session, no
duplicates, nothing lost. The expert is a deterministic scripted backend behind the
loopback OpenAI-compatible server of :mod:`memgym.llm.server`."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memgym.data_synth.locomo import load_locomo
from memgym.data_synth.synth_qa import synth_qa
from memgym.llm.embeddings import HashEmbedder
from memgym.llm.server import serve_backend
from tests.helpers import FaultyServer, ScriptedBackend, fake_expert

pytestmark = pytest.mark.filterwarnings("ignore::memgym.data_synth.errors.DataQuirkWarning")


REPO = Path(__file__).resolve().parents[2]
N_SESSIONS = 6


def _complete_lines(path: Path) -> int:
    return path.read_bytes().count(b"\n") if path.exists() else 0


def test_synth_qa_sigkill_then_rerun_resumes_exactly(tmp_path):
    server, _, url = serve_backend(ScriptedBackend(fake_expert, model_id="fake"), server_class=FaultyServer,
                                   delay_s=0.3)
    out = tmp_path / "qa.jsonl"
    cmd = [sys.executable, "-m", "memgym.launch.cli", "synth", "qa", "--expert", f"openai:{url}#fake",
           "--conversations", "conv-26", "--n-sessions", str(N_SESSIONS), "--concurrency", "1",
           "--embedder", "hash:256", "--cache", "none", "--out", str(out), "--quiet"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OPENAI_API_KEY": "EMPTY"}
    try:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        deadline = time.time() + 90
        while _complete_lines(out) < 2 and proc.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
        assert proc.returncode == -signal.SIGKILL, proc.stderr.read().decode()[-2000:]
        done_before = _complete_lines(out)
        assert 2 <= done_before < N_SESSIONS
        # simulate the worst case, a kill in the middle of writing the next line
        with open(out, "ab") as fh:
            fh.write(b'{"conversation_id": "conv-26", "session": 99, "qa": [{"ques')
        rerun = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, timeout=120)
        assert rerun.returncode == 0, rerun.stderr.decode()[-2000:]
    finally:
        server.shutdown()
        server.server_close()
    summary = json.loads(rerun.stdout.decode().strip().splitlines()[-1])
    assert summary["sessions_resumed"] == done_before
    assert summary["sessions_written"] == N_SESSIONS - done_before
    assert summary["repaired_bytes"] > 0
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["session"] for x in lines] == list(range(1, N_SESSIONS + 1))  # one per session, in order
    # nothing lost or altered: the same QA as an uninterrupted run
    conv = load_locomo(ids=["conv-26"])[0]
    clean = tmp_path / "clean.jsonl"
    synth_qa([conv], clean, backend=ScriptedBackend(fake_expert), embedder=HashEmbedder(256), n_sessions=N_SESSIONS,
             concurrency=1, progress=False)
    assert [x["qa"] for x in lines] == [json.loads(x)["qa"] for x in clean.read_text().splitlines()]
