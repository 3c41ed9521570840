"""``synth qa`` resume: settings recorded and checked, empty sessions retried, non-zero exit
when nothing usable was produced (issue 12, finding 9)."""
from __future__ import annotations

import json

import pytest

from memgym.data_synth.locomo import load_locomo
from memgym.data_synth.synth_qa import synth_qa
from memgym.launch.cli import main
from memgym.llm.embeddings import HashEmbedder
from tests.helpers import ScriptedBackend, fake_expert

pytestmark = pytest.mark.filterwarnings("ignore::memgym.data_synth.errors.DataQuirkWarning")


@pytest.fixture(scope="module")
def conv26():
    return load_locomo(ids=["conv-26"])[0]


def test_resume_with_other_settings_is_refused(tmp_path, conv26):
    out = tmp_path / "qa.jsonl"
    synth_qa([conv26], out, backend=ScriptedBackend(fake_expert, model_id="a"), embedder=HashEmbedder(256),
             n_sessions=2, progress=False)
    before = out.read_bytes()
    assert [json.loads(x)["j"] for x in before.decode().splitlines()] == [5, 5]
    with pytest.raises(ValueError, match=r"line 1 was written with other settings: j 5 \(now 3\)"):
        synth_qa([conv26], out, backend=ScriptedBackend(fake_expert, model_id="a"), embedder=HashEmbedder(256),
                 n_sessions=3, j=3, progress=False)
    with pytest.raises(ValueError, match=r"expert 'a' \(now 'b'\)"):
        synth_qa([conv26], out, backend=ScriptedBackend(fake_expert, model_id="b"), embedder=HashEmbedder(256),
                 n_sessions=3, progress=False)
    with pytest.raises(ValueError, match=r"source 'expert' \(now 'benchmark'\)"):
        synth_qa([conv26], out, source="benchmark", n_sessions=3, progress=False)
    assert out.read_bytes() == before  # nothing half-applied


def test_empty_sessions_are_retried_and_an_all_empty_run_fails(tmp_path, conv26, capsys):
    out = tmp_path / "qa.jsonl"
    synth_qa([conv26], out, backend=ScriptedBackend(lambda m, p: "no idea", model_id="a"),
             embedder=HashEmbedder(256), n_sessions=2, max_tries=1, progress=False)
    assert [json.loads(x)["qa"] for x in out.read_text().splitlines()] == [[], []]
    stats = synth_qa([conv26], out, backend=ScriptedBackend(fake_expert, model_id="a"), embedder=HashEmbedder(256),
                     n_sessions=2, max_tries=3, progress=False)
    assert (stats.sessions_retried_empty, stats.sessions_resumed, stats.sessions_written) == (2, 0, 2)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [(x["session"], len(x["qa"])) for x in lines] == [(1, 5), (2, 5)]


def test_cli_exits_nonzero_when_every_session_is_empty(tmp_path, capsys, monkeypatch):
    import memgym.launch.cmd_synth as cmd

    monkeypatch.setattr(cmd, "load_role_backend",
                        lambda rt, spec, role, c=8: ScriptedBackend(lambda m, p: "{}", model_id="x"))
    out = tmp_path / "e.jsonl"
    rc = main(["synth", "qa", "--expert", "hf:smollm2", "--conversations", "conv-26", "--n-sessions", "2",
               "--max-tries", "1", "--embedder", "hash:256", "--cache", "none", "--out", str(out), "--quiet"])
    assert rc == 1 and "came back with no question" in capsys.readouterr().err
