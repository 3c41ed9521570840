"""``memgym bank replay`` / ``memgym bank check`` contracts, run as real subprocesses."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from memgym.data_synth.paths import expert_dir
from memgym.launch.cmd_bank import check_output
from tests.helpers import CUT


def memgym(*args, stdin: bytes = b""):
    return subprocess.run([sys.executable, "-m", "memgym.launch.cli", *args], input=stdin, capture_output=True, timeout=120)


def test_replay_prints_counts_and_writes_bank(tmp_path):
    out = tmp_path / "bank.json"
    r = memgym("bank", "replay", str(expert_dir() / "conv-30.jsonl"), "--out", str(out))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == {"sessions": 19, "core_chars": 2712, "episodic": 52, "semantic": 45, "procedural": 8}
    assert json.loads(out.read_text())["next_id"] == {"episodic": 53, "semantic": 46, "procedural": 9}


def test_replay_broken_file_exits_nonzero_naming_line(tmp_path):
    p = tmp_path / "t.jsonl"
    p.write_text((expert_dir() / "conv-30.jsonl").read_text().splitlines()[0] + "\n{not json\n")
    r = memgym("bank", "replay", str(p))
    assert r.returncode == 1 and b"line 2" in r.stderr and b"Traceback" not in r.stderr


HOSTILE = [
    b"", b"\x00\x01\xff\xfe" * 50, b'{"operations": [{"action": "ADD", "memo', b"[" * 50000,
    b'{"operations": {"action": "ADD"}}', b'{"operations": [1, 2, 3]}', b"null", b"42", b'"string"',
    b'{"operations": [{"action": "ADD", "memory": "x"}]}' * 3, b"A" * 300_000,
    b'{"operation": "REPLACE", "old_text": "nothing", "new_text": "x"}',
]


@pytest.mark.parametrize("manager", ["core", "episodic"])
def test_check_never_tracebacks(manager):
    for payload in HOSTILE:
        r = memgym("bank", "check", "--manager", manager, stdin=payload)
        assert r.returncode == 0, (payload[:40], r.stderr)
        assert b"Traceback" not in r.stderr
        v = json.loads(r.stdout)
        assert set(v) == {"ok", "error", "message"} and isinstance(v["ok"], bool)


def test_check_against_a_bank(tmp_path):
    bank = tmp_path / "b.json"
    memgym("bank", "replay", str(expert_dir() / "conv-30.jsonl"), "--out", str(bank))
    ok = memgym("bank", "check", "--manager", "semantic", "--bank", str(bank),
                stdin=b'{"operations": [{"action": "UPDATE", "id": "S45", "memory": "new"}]}')
    assert json.loads(ok.stdout) == {"ok": True, "error": None, "message": "valid; applies cleanly"}
    bad = memgym("bank", "check", "--manager", "semantic", "--bank", str(bank),
                 stdin=b'{"operations": [{"action": "UPDATE", "id": "S46", "memory": "new"}]}')
    assert json.loads(bad.stdout)["error"] == "unknown_id"
    missing = memgym("bank", "check", "--manager", "core", "--bank", str(tmp_path / "nope.json"), stdin=b"{}")
    assert missing.returncode == 0 and json.loads(missing.stdout)["error"] == "bank_file_error"




def test_bank_check_reports_truncated():
    v = check_output("episodic", CUT.encode())
    assert (v["ok"], v["error"]) == (False, "truncated") and "unterminated string" in v["message"]
    v = check_output("core", b'{"operation": "REWRITE", "content": "short"}', finish_reason="length")
    assert (v["ok"], v["error"]) == (False, "truncated")
    assert check_output("core", b'{"operation": "REWRITE", "content": "short"}')["ok"] is True
