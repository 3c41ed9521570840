"""Synthetic session QA: validator, quotas, benchmark bucketing, resumable writing, CLI."""
from __future__ import annotations

import json

import pytest

from memgym.data_synth.jsonl import JsonlCorruptError, JsonlLockedError, ResumableJsonl
from memgym.data_synth.locomo import load_locomo
from memgym.data_synth.qa_format import load_session_qa
from memgym.data_synth.synth_qa import bucket_benchmark_qa, synth_qa
from memgym.data_synth.synth_qa_prompt import kind_quota, validate_output
from memgym.launch.cli import main
from memgym.llm.embeddings import HashEmbedder
from tests.helpers import ScriptedBackend, fake_expert

pytestmark = pytest.mark.filterwarnings("ignore::memgym.data_synth.errors.DataQuirkWarning")


@pytest.fixture(scope="module")
def conv26():
    return load_locomo(ids=["conv-26"])[0]


def test_kind_quota():
    assert kind_quota(5, True) == {"single-session": 3, "multi-session": 1, "temporal": 1}
    assert kind_quota(5, False) == {"single-session": 4, "multi-session": 0, "temporal": 1}
    assert kind_quota(10, True) == {"single-session": 5, "multi-session": 3, "temporal": 2}
    with pytest.raises(ValueError, match=">= 1"):
        kind_quota(0, True)


def item(q, a="a dog", ev=("D2:1",), kind="single-session"):
    return {"question": q, "answer": a, "evidence": list(ev), "kind": kind}


def test_validator_rejects_invalid_evidence_and_counts_every_reason(conv26):
    s2 = conv26.sessions[1]
    quota = {"single-session": 3, "multi-session": 1, "temporal": 1}
    out = json.dumps({"qa": [
        item("Which pet did Melanie describe?"),                                     # ok
        item("What painting did Caroline finish?", ev=["D2:999"]),                   # unknown id
        item("Where does Melanie run races?", ev=["D77:1"]),                         # unknown id
        item("What did Caroline plan in the summer?", ev=["D5:1"]),                  # later session
        item("What was said in the first chat?", ev=["D1:2"]),                       # nothing from session 2
        item("Which support group did Caroline attend?", a="   "),                   # empty answer
        item("", a="x"),                                                             # empty question
        item("How did both friends feel?", ev=["D2:1"], kind="multi-session"),       # one session only
        item("Why did they meet?", kind="summary"),                                  # bad kind
        item("Which pet did Melanie describe?"),                                     # duplicate of the first
        item("What did Melanie and Caroline link?", ev=["D1:3", "D2:2"], kind="multi-session"),  # ok
        "not an object",
    ]})
    accepted, counts = validate_output(out, conv26, s2, quota, [], HashEmbedder(256))
    assert [a["question"] for a in accepted] == ["Which pet did Melanie describe?",
                                                 "What did Melanie and Caroline link?"]
    assert accepted[1]["capability"] == "M"
    assert dict(counts) == {"unknown_evidence": 2, "future_evidence": 1, "no_current_evidence": 1, "empty_answer": 1,
                            "empty_question": 1, "kind_mismatch": 1, "bad_kind": 1, "near_duplicate": 1,
                            "unparsable": 1}


def test_validator_unparsable_quota_surplus_and_kept_duplicates(conv26):
    s2 = conv26.sessions[1]
    emb = HashEmbedder(256)
    assert validate_output("Sure! Here are some questions.", conv26, s2, {"single-session": 3}, [], emb)[1] == \
        {"unparsable": 1}
    kept = [item("Which pet did Melanie describe?")]
    out = "```json\n" + json.dumps([item("Which pet did Melanie describe ?"), item("What races does Melanie run?"),
                                    item("What did Caroline paint last week?")]) + "\n```"
    accepted, counts = validate_output(out, conv26, s2, {"single-session": 1}, kept, emb)
    assert [a["question"] for a in accepted] == ["What races does Melanie run?"]
    assert dict(counts) == {"near_duplicate": 1, "surplus": 1}


def test_bucket_benchmark_qa_by_latest_evidence_session(conv26):
    buckets, dropped = bucket_benchmark_qa(conv26, n_sessions=3)
    assert set(buckets) == {1, 2, 3}
    for s, items in buckets.items():
        for it in items:
            ev_sessions = {conv26.turn_index[e][0] for e in it["evidence"]}
            assert max(ev_sessions) == s
    kept = sum(len(v) for v in buckets.values())
    assert kept + dropped == len(conv26.questions)
    expected = sum(1 for q in conv26.questions if conv26.evidence_sessions(q) and max(conv26.evidence_sessions(q)) <= 3)
    assert kept == expected and kept > 0


def test_synth_qa_writes_one_line_per_session_and_resumes(tmp_path, conv26):
    out = tmp_path / "qa.jsonl"
    backend = ScriptedBackend(fake_expert)
    stats = synth_qa([conv26], out, backend=backend, embedder=HashEmbedder(256), n_sessions=3, concurrency=2,
                     progress=False)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["session"] for x in lines] == [1, 2, 3]
    assert [len(x["qa"]) for x in lines] == [5, 5, 5]
    assert [q["kind"] for q in lines[1]["qa"]] == ["single-session"] * 3 + ["multi-session", "temporal"]
    assert stats.sessions_written == 3 and stats.accepted == 15 and sum(stats.rejected.values()) == 0
    assert stats.model_calls == backend.calls == 3 and stats.prompt_tokens > 0
    # loads as reward QA
    assert len(load_session_qa(out)[("conv-26", 2)]) == 5
    # a torn tail (killed mid-write) is cut off; finished sessions are skipped, nothing duplicated
    with open(out, "ab") as fh:
        fh.write(b'{"conversation_id": "conv-26", "session": 4, "qa": [{"quest')
    stats2 = synth_qa([conv26], out, backend=backend, embedder=HashEmbedder(256), n_sessions=4, progress=False)
    lines2 = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["session"] for x in lines2] == [1, 2, 3, 4] and lines2[:3] == lines
    assert (stats2.sessions_resumed, stats2.sessions_written, stats2.repaired_bytes) == (3, 1, 59)
    assert backend.calls == 4


def test_synth_qa_retries_with_feedback_until_quota_or_max_tries(tmp_path, conv26):
    tries = {1: 0, 2: 0}

    def expert(messages, params):
        text = messages[-1]["content"]
        sess = int(text.split("## Current session ")[1].split(" ", 1)[0])
        tries[sess] += 1
        if sess == 1:
            return "Sure, here are some questions!"  # never parses
        if tries[2] == 1:
            return json.dumps({"qa": [item("What did Melanie say about her pottery class?", ev=["D2:99"])]})
        return json.dumps({"qa": [item("What did Melanie run for charity?", ev=["D2:1"])]})

    backend = ScriptedBackend(expert)
    out = tmp_path / "qa.jsonl"
    stats = synth_qa([conv26], out, backend=backend, embedder=HashEmbedder(256), j=1, max_tries=3, n_sessions=2,
                     concurrency=2, progress=False)
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert (lines[0]["tries"], lines[0]["qa"], lines[0]["missing"], lines[0]["rejected"]) == \
        (3, [], 1, {"unparsable": 3})
    assert (lines[1]["tries"], lines[1]["missing"], lines[1]["rejected"]) == (2, 0, {"unknown_evidence": 1})
    assert lines[1]["qa"][0]["evidence"] == ["D2:1"]
    retry_prompt = [m for m, _ in backend.seen if "Current session 2" in m[-1]["content"]][1][-1]["content"]
    # the retry tells the expert why, and numbers the attempt
    assert "answer (attempt 1) was rejected: 1 item(s) with evidence ids that are not in the conversation" in retry_prompt
    prompts1 = [m[-1]["content"] for m, _ in backend.seen if "Current session 1" in m[-1]["content"]]
    assert len(set(prompts1)) == 3  # three distinct prompts: no retry is a cache hit of the previous one
    assert stats.sessions_short == 1 and stats.attempts == 5
    assert stats.to_json()["rejected_share"] == pytest.approx(4 / 5)


def test_resumable_jsonl_rejects_corruption_and_concurrent_writers(tmp_path):
    p = tmp_path / "f.jsonl"
    p.write_text('{"k": 1}\nnot json\n{"k": 2}\n')
    with pytest.raises(JsonlCorruptError, match="line 2 is a complete line"):
        ResumableJsonl(p, lambda r: r["k"])
    p.write_text('{"k": 1}\n{"k": 1}\n')
    with pytest.raises(JsonlCorruptError, match="repeats the key 1"):
        ResumableJsonl(p, lambda r: r["k"])
    p.write_text('{"k": 1}\n')
    with ResumableJsonl(p, lambda r: r["k"]) as log:
        with pytest.raises(JsonlLockedError, match="another process"):
            ResumableJsonl(p, lambda r: r["k"])
        with pytest.raises(ValueError, match="already written"):
            log.append({"k": 1})
        log.append({"k": 2})
    assert p.read_text() == '{"k": 1}\n{"k": 2}\n'


def test_cli_refuses_test_split_and_buckets_benchmark_qa(tmp_path, capsys):
    out = tmp_path / "b.jsonl"
    assert main(["synth", "qa", "--source", "benchmark", "--split", "test", "--out", str(out)]) == 2
    assert "refusing the test split" in capsys.readouterr().err
    assert main(["synth", "qa", "--source", "benchmark", "--conversations", "conv-43", "--out", str(out)]) == 2
    assert "conv-43" in capsys.readouterr().err
    assert main(["synth", "qa", "--conversations", "conv-26", "--out", str(out)]) == 2
    assert "--expert" in capsys.readouterr().err
    assert not out.exists()
    assert main(["synth", "qa", "--source", "benchmark", "--conversations", "conv-26", "--n-sessions", "3",
                 "--out", str(out), "--quiet"]) == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    lines = [json.loads(x) for x in out.read_text().splitlines()]
    assert [x["session"] for x in lines] == [1, 2, 3] and summary["sessions_written"] == 3
    assert json.loads((tmp_path / "b.jsonl.summary.json").read_text())["benchmark_dropped"] == summary["benchmark_dropped"]
