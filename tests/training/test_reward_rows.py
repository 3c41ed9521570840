"""ADRPO's reward rows (training/reward_rows.py), whole sessions and segments: the whole-session rows
of conv-30 (real expert trajectory), the question placement (hand-computed), the segment rows of
conv-26's first two sessions (SmolLM2's tokenizer), and a reward that scores two segments of one
session apart (per-segment caches)."""
from __future__ import annotations

import json
import warnings
from collections import Counter

import pytest

from memgym.data_synth.expert import replay
from memgym.data_synth.locomo import load_locomo
from memgym.data_synth.paths import expert_dir
from memgym.llm.embeddings import HashEmbedder
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.prompts import build_prompt
from memgym.rewards.samples import sample_key
from memgym.rewards.session_reward import SessionReward, SessionRewardConfig
from tests.helpers import WordTokenizer
from memgym.training.reward_rows import build_rows, question_segments, reward_rows

pytestmark = pytest.mark.filterwarnings("ignore::memgym.data_synth.errors.DataQuirkWarning")

CONV26 = expert_dir() / "conv-26.jsonl"
CONV30 = expert_dir() / "conv-30.jsonl"


# ---- whole-session rows ----------------------------------------------------------------------
@pytest.fixture(scope="module")
def samples():
    return build_rows([CONV30], embedder=HashEmbedder(128))


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
        got = build_rows([CONV30], qa_path=qa_file, managers=["episodic", "core"])
    assert [s.key for s in got] == ["conv-30/s3/episodic", "conv-30/s3/core"]
    assert got[0].qa[0].answer == "Paris" and got[0].qa[0].id == "conv-30/s3/q0"


def test_unknown_manager_and_missing_file():
    with pytest.raises(ValueError, match="unknown manager"):
        build_rows([CONV30], managers=["summary"])
    with pytest.raises(FileNotFoundError, match="nope.jsonl"):
        build_rows(["nope.jsonl"])
    assert MANAGERS == ("core", "episodic", "semantic", "procedural")


# ---- segment rows ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from memgym.training.common import load_tokenizer

    return load_tokenizer(tiny_model_dir)  # SmolLM2's real tokenizer


def test_question_goes_to_the_segment_that_completes_its_evidence():
    segs = [["D1:1", "D1:2"], ["D1:3"], ["D1:4", "D1:5"]]
    assert question_segments([["D1:2"], ["D1:4", "D1:1"], ["D1:3", "D1:2"], [], ["D9:1"]], segs) == [0, 2, 1, 2, 2]
    with pytest.raises(ValueError, match="no segments"):
        question_segments([["D1:1"]], [])
    assert sample_key("conv-26", 2, "core", 3) == "conv-26/s2.3/core" and sample_key("c", 2, "core") == "c/s2/core"


@pytest.fixture(scope="module")
def rows(tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return build_rows([CONV26], tokenizer=tokenizer, segment_tokens=200)


def test_segment_rows_of_conv26_partition_each_sessions_questions(rows, tokenizer):
    from memgym.training.sft_data import expert_session_states

    states = {st.session.index: st for st in expert_session_states([CONV26])}
    first2 = [r for r in rows if r.session in (1, 2)]
    # sessions 1 and 2 have 3 and 4 segments (test_sft_segments); 5 questions each, placed by evidence
    core = [r for r in first2 if r.manager == "core"]
    assert [r.key for r in core] == ["conv-26/s1.1/core", "conv-26/s1.2/core", "conv-26/s1.3/core",
                                     "conv-26/s2.1/core", "conv-26/s2.2/core", "conv-26/s2.3/core",
                                     "conv-26/s2.4/core"]
    for sess in (1, 2):
        got = [q.question for r in core if r.session == sess for q in r.qa]
        assert Counter(got) == Counter(q["question"] for q in states[sess].step.qa)  # each question once
        for r in (r for r in core if r.session == sess):
            turns = {t.id for t in _segment_turns(r)}
            assert all(any(e in turns for e in q.evidence) for q in r.qa)  # its segment holds its evidence
    assert len(rows) == 276 and Counter(r.manager for r in rows) == Counter({m: 69 for m in
                                                                              ("core", "episodic", "semantic",
                                                                               "procedural")})
    s11 = next(r for r in rows if r.key == "conv-26/s1.1/episodic")
    assert s11.segment == 1 and s11.unit == ("conv-26", 1, 1)
    assert s11.expert_outputs["episodic"].startswith('{"operations": [{"action": "ADD", "memory": "2023-05-07: C')
    assert "[D1:1]" in s11.messages[1]["content"] and "[D1:7]" not in s11.messages[1]["content"]


def _segment_turns(sample):
    text = sample.messages[1]["content"].split("New session transcript:\n", 1)[1]
    from types import SimpleNamespace

    return [SimpleNamespace(id=ln.split("]")[0][1:]) for ln in text.splitlines() if ln.startswith("[D")]


def test_reward_scores_each_segment_against_its_own_expert_share(rows):
    """The expert's own share scores gate 1 and LP 0 on every segment of session 2; a cache keyed
    by session only would measure segment 2's completion against segment 1's expert length."""
    reward = SessionReward(SessionRewardConfig(mode="counterfactual"), embedder=HashEmbedder(256),
                           tokenizer=WordTokenizer())
    epi = [r for r in rows if r.session == 2 and r.manager == "episodic"]
    lens = [len(r.expert_outputs["episodic"].split()) for r in epi]
    assert len(set(lens)) > 1  # the segments' expert shares differ in length
    out = reward(epi, [r.expert_outputs["episodic"] for r in epi])
    assert [b.gate for b in out] == [1] * len(epi)
    assert [b.lp for b in out] == [0.0] * len(epi)
    assert [b.expert_length_tokens for b in out] == lens


def test_reward_rows_chooses_whole_sessions_or_segments(tokenizer):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        whole = reward_rows([CONV26], tokenizer=tokenizer, embedder=None, managers=["core"])
    assert [r.key for r in whole[:2]] == ["conv-26/s1/core", "conv-26/s2/core"] and whole[0].segment == 0
    with pytest.raises(ValueError, match="qa_path"):
        reward_rows([CONV26], tokenizer=tokenizer, embedder=None, segment_tokens=200, qa_path="qa.jsonl")
    # the selection of the same pipeline: names resolved in $MEMGYM_DATA/expert, sessions, then the first N
    picked = reward_rows(["conv-26"], tokenizer=tokenizer, embedder=None, sessions=[2], first=3)
    assert [r.key for r in picked] == ["conv-26/s2/core", "conv-26/s2/episodic", "conv-26/s2/semantic"]
