"""build_reward_samples on the real expert trajectories of conv-30."""
from __future__ import annotations

import json

import pytest

from memgym.data_synth.expert import replay
from memgym.data_synth.locomo import load_locomo
from memgym.data_synth.paths import expert_dir
from memgym.llm.embeddings import HashEmbedder
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.prompts import build_prompt
from memgym.rewards.samples import build_reward_samples

pytestmark = pytest.mark.filterwarnings("ignore::memgym.data_synth.errors.DataQuirkWarning")


CONV30 = expert_dir() / "conv-30.jsonl"


@pytest.fixture(scope="module")
def samples():
    return build_reward_samples(CONV30, embedder=HashEmbedder(128))


def test_one_sample_per_session_and_manager(samples):
    assert len(samples) == 19 * 4
    assert [s.key for s in samples[:5]] == ["conv-30/s1/core", "conv-30/s1/episodic", "conv-30/s1/semantic",
                                            "conv-30/s1/procedural", "conv-30/s2/core"]
    assert all(len(s.qa) == 5 for s in samples)
    s2 = samples[4]
    first = json.loads(CONV30.read_text().splitlines()[1])
    assert [q.question for q in s2.qa] == [q["question"] for q in first["qa"]]
    assert s2.qa[3].category == "multi-session" and s2.qa[3].capability.value == "M"
    assert s2.qa[0].question_date == "2:32 pm on 29 January, 2023"
    assert json.loads(s2.expert_outputs["semantic"]) == first["semantic"]


def test_bank_before_is_the_expert_bank_after_the_previous_session(samples):
    assert samples[0].bank_before.dumps() == replay(CONV30, upto_session=0).dumps()
    s5 = next(s for s in samples if s.key == "conv-30/s5/episodic")
    assert s5.bank_before.dumps() == replay(CONV30, upto_session=4).dumps()
    # the four managers of a session share one (never mutated) bank
    assert len({id(s.bank_before) for s in samples if s.session == 5}) == 1


def test_messages_are_the_inference_prompt(samples):
    conv = load_locomo(ids=["conv-30"])[0]
    emb = HashEmbedder(128)
    for s in samples[8:12]:
        session = conv.sessions[s.session - 1]
        assert s.messages == build_prompt(s.manager, s.bank_before, session, emb).messages


def test_qa_path_replaces_trajectory_qa_and_skips_sessions_without_qa(tmp_path):
    qa_file = tmp_path / "qa.jsonl"
    line = {"conversation_id": "conv-30", "session": 3, "date": "d",
            "qa": [{"question": "Where did Jon go?", "answer": "Paris", "evidence": ["D3:1"], "kind": "temporal"}]}
    qa_file.write_text(json.dumps(line) + "\n")
    with pytest.warns(UserWarning, match="18 session\\(s\\) without QA skipped"):
        got = build_reward_samples(CONV30, qa_path=qa_file, managers=["episodic", "core"])
    assert [s.key for s in got] == ["conv-30/s3/episodic", "conv-30/s3/core"]
    assert got[0].qa[0].answer == "Paris" and got[0].qa[0].id == "conv-30/s3/q0"


def test_unknown_manager_and_missing_file():
    with pytest.raises(ValueError, match="unknown manager"):
        build_reward_samples(CONV30, managers=["summary"])
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        build_reward_samples("nope.jsonl")
    assert MANAGERS == ("core", "episodic", "semantic", "procedural")
