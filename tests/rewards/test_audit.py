"""Reward audit: deterministic controls, hand-computed means, and the CLI on conv-30."""
from __future__ import annotations

import json

import pytest

from memgym.data_synth.paths import expert_dir
from memgym.launch.cli import main
from memgym.llm.embeddings import HashEmbedder
from memgym.memory_bank.bank import MemoryBank
from memgym.rewards.audit import control_outputs, run_audit
from memgym.rewards.samples import RewardSample
from memgym.training.reward_rows import build_rows
from memgym.rewards.session_reward import SessionReward, SessionRewardConfig
from tests.helpers import DOG, PILOT, WordTokenizer, bank_with, ops, qa

pytestmark = pytest.mark.filterwarnings("ignore::memgym.data_synth.errors.DataQuirkWarning")
CONV30 = expert_dir() / "conv-30.jsonl"


def test_shuffled_control_is_a_cyclic_derangement_of_sessions():
    samples = build_rows([CONV30], managers=["semantic", "core"])
    controls = control_outputs(samples, "shuffled")
    by_session = {s.session: s.expert_outputs for s in samples}
    for s, c in zip(samples, controls):
        donor = s.session % 19 + 1  # t -> t+1, 19 -> 1
        assert c == by_session[donor][s.manager]
    assert controls == control_outputs(samples, "shuffled")  # deterministic
    assert control_outputs(samples[:2], "empty") == ['{"operations": []}', '{"operation": "NONE"}']
    with pytest.raises(ValueError, match=">= 2 sessions"):
        control_outputs([s for s in samples if s.session == 1], "shuffled")
    with pytest.raises(ValueError, match="unknown control"):
        control_outputs(samples, "random")


def test_audit_means_by_hand():
    """Session 1 stores the dog, session 2 the pilot; each session asks about its own fact.
    Shuffled, each session gets the other's episodic output and misses its own fact."""
    empty = {"core": '{"operation": "NONE"}', "semantic": '{"operations": []}', "procedural": '{"operations": []}'}
    s1 = RewardSample("c/s1/episodic", "c", 1, "episodic", [], {**empty, "episodic": ops(DOG)}, MemoryBank(),
                      [qa("What is the name of the dog Alice adopted?", "Biscuit")])
    s2 = RewardSample("c/s2/episodic", "c", 2, "episodic", [], {**empty, "episodic": ops(PILOT)}, MemoryBank(),
                      [qa("What is Bob's job?", "airline pilot")])
    reward = SessionReward(SessionRewardConfig(mode="isolated"), embedder=HashEmbedder(512), tokenizer=WordTokenizer())
    rep = run_audit([s1, s2], reward, "shuffled", progress=False)
    assert (rep["expert_mean"], rep["control_mean"], rep["n"]) == (1.0, 0.0, 2)
    assert rep["by_manager"] == {"episodic": {"expert_mean": 1.0, "control_mean": 0.0, "n": 2, "expert_acc_mean": 1.0,
                                              "control_acc_mean": 0.0, "control_gate_rate": 1.0}}
    # a prior session's memory answers its question under the empty control (bank before t is kept)
    s2.bank_before = bank_with(1, episodic=[PILOT])
    rep = run_audit([s1, s2], reward, "empty", progress=False)
    assert rep["control_acc_mean"] == 0.5
    with pytest.raises(ValueError, match="counterfactual or isolated"):
        run_audit([s1], SessionReward(SessionRewardConfig(mode="joint"), embedder=HashEmbedder(),
                                      tokenizer=WordTokenizer()))


def test_cli_audit_on_conv30_separates_expert_from_empty(capsys):
    rc = main(["reward", "audit", "--trajectories", str(CONV30), "--judge", "answer-recall", "--control", "empty",
               "--mode", "isolated", "--embedder", "hash:256", "--quiet", "--cache", "none"])
    assert rc == 0
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["n"] == 76 and set(rep["by_manager"]) == {"core", "episodic", "semantic", "procedural"}
    assert rep["expert_mean"] > rep["control_mean"] + 0.2
    assert main(["reward", "audit", "--trajectories", "missing.jsonl", "--embedder", "hash:256", "--quiet"]) == 2
    assert "missing.jsonl" in capsys.readouterr().err
