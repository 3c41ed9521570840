"""A coder run through a fake OpenAI-compatible server answering with competent edits
(:mod:`tests.evolution.search.competent_coder`: hybrid BM25 + dense, written-out date prefixes,
preceding turns; a repair turn and a validation revise turn on the way) records every request
and reply; ``memgym evolve --proposer replay --from RUN`` with the server gone reproduces the
archive fingerprint and the summary scores and tokens; a request that does not match the
recording is one typed error naming the round. The request states the run's facts."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from evolution.search.archive import Archive
from evolution.search.config import EvolveConfig
from evolution.search.api import evolve
from evolution.search.proposers.facts import run_facts
from evolution.search.proposers.replay import ReplayMismatchError, load_recording
from tests.evolution.search.competent_coder import serve_coder

SMALL = dict(train=["conv-26"], valid=["conv-30"], n_sessions=2, max_questions=6, extractor="turns",
             rounds_integrate=0, plan_mode="question", scorer="answer-recall", probe_units=200, probe_batches=10,
             progress=False, embedder="hash:256", context_tokens=256, context_tokenizer="smollm2", rounds_cold=3,
             rounds_refine=2)


def _fingerprint(run: Path):
    return Archive.from_json(json.loads((run / "state.json").read_text())["archive"]).fingerprint()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("rec")
    server, spec = serve_coder()
    try:
        cfg = EvolveConfig(**SMALL, proposer="coder", coder_model=spec, out=str(root / "run"))
        from launch.cli import main
        (root / "recipe.yaml").write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items()))
        assert main(["evolve", "--config", str(root / "recipe.yaml"), "--proposer", "coder", "--coder_model", spec,
                     "--out", cfg.out]) == 0
        requests = server.requests_total
    finally:
        server.shutdown()
        server.server_close()
    return root / "run", requests


def test_recorded_requests_state_the_facts_and_every_turn(recorded):
    run, requests = recorded
    rec = load_recording(run)
    turns = sum(len(r["propose"]) + len(r["revise"]) for r in rec.values())
    assert turns == requests and sorted(rec) == [1, 2, 3, 4, 5]
    # round 2: a mis-copied SEARCH, the repair turn, then validation fails (strftime imports time) and the revise
    assert len(rec[2]["propose"]) == 2 and len(rec[2]["revise"]) == 1
    assert rec[2]["propose"][1][0]["messages"][-1]["content"].startswith("Your edit could not be applied")
    assert "import of 'time' is not allowed" in rec[2]["revise"][0][0]["messages"][-1]["content"]
    system = rec[1]["propose"][0][0]["messages"][0]["content"]
    assert "first 256 tokens of the `smollm2` tokenizer, about " in system and "Scorer: answer-recall" in system
    assert "fields you add to Query stay empty" in system and "budget of 0 calls per conversation" in system
    assert "cosine maxima" in system and "NOT rates" in system and "after the cut to 256 tokens" in system
    s = json.loads((run / "summary.json").read_text())
    hist = json.loads((run / "state.json").read_text())["history"]
    assert [h["accepted"][:4] for h in hist[1:4]] == ["base", "base", "base"]  # the three competent edits win
    assert s["final"]["valid"]["overall"] > s["seed"]["valid"]["overall"] + 0.2
    # tokens per role per round: the table and summary.json agree with the ledger
    led = json.loads((run / "state.json").read_text())["ledger"]["rounds"]
    assert s["tokens_by_round"]["rounds"]["2"]["coder"] == led["2"]["coder"]["prompt"] + led["2"]["coder"]["completion"]
    assert s["tokens_by_round"]["run"]["coder"] == sum(r["prompt"] + r["completion"] for r in s["tokens"].values())
    report = (run / "report.md").read_text()
    row = s["tokens_by_round"]["rounds"]["2"]["coder"]
    assert "### Tokens per role per round" in report and f"| 2 | {row:,} | 0 | 0 | 0 | 0 | {row:,} |" in report


def test_replay_without_server_reproduces_the_run(recorded, tmp_path):
    from launch.cli import main

    run, _ = recorded
    out = tmp_path / "replay"
    assert main(["evolve", "--proposer", "replay", "--from", str(run), "--out", str(out)]) == 0
    assert _fingerprint(out) == _fingerprint(run)
    a, b = (json.loads((d / "summary.json").read_text()) for d in (run, out))
    for k in ("seed", "rounds", "candidates_evaluated", "proposals_failed", "tokens", "tokens_by_round", "boundary"):
        assert a[k] == b[k], k
    assert a["final"]["valid"] == b["final"]["valid"] and a["final_id"] == b["final_id"]
    assert json.loads((out / "recipe.json").read_text())["proposer"] == "replay"


def test_a_request_that_does_not_match_the_recording_names_the_round(recorded, tmp_path, capsys):
    from launch.cli import main

    run, _ = recorded
    bad = tmp_path / "bad"
    shutil.copytree(run, bad, ignore=shutil.ignore_patterns("*.sqlite*", ".lock"))
    p = bad / "candidates" / "r02" / "proposal.json"
    prop = json.loads(p.read_text())
    prop["result"]["transcript"][0]["messages"][1]["content"] += "\nan edited line"
    p.write_text(json.dumps(prop))
    cfg = EvolveConfig(**SMALL, proposer="replay", replay_from=str(bad), out=str(tmp_path / "r"))
    with pytest.raises(ReplayMismatchError) as e:
        evolve(cfg)
    assert e.value.round == 2 and str(e.value).startswith("round 2, turn 1: the request does not match")
    assert "first extra line" in str(e.value)
    # another recipe renders other facts: the first request already differs, one line on stderr, exit 2
    assert main(["evolve", "--from", str(run), "--context_tokens", "300", "--out", str(tmp_path / "r2")]) == 2
    err = capsys.readouterr().err.strip().splitlines()[-1]
    assert "round 1, turn 1: the request does not match" in err and "first 300 tokens" in err


def test_the_facts_give_the_budget_in_characters_of_the_data_and_the_acceptance_rules():
    from data_synth.datasets import load_conversations
    from evolution.execution.context_budget import _load_tokenizer

    cfg = EvolveConfig(dataset="locomo", extractor="turns", plan_mode="question", scorer="answer-recall",
                       context_tokens=1024, context_tokenizer="smollm2", rounds_integrate=2, delta=0.02,
                       progress=False)
    convs = load_conversations("locomo", ids=["conv-26"])
    text = "\n".join(f"[{s.date.date().isoformat() if s.date else ''}] {t.speaker}: {t.text}"
                     for s in convs[0].sessions for t in s.turns if (t.text or "").strip())
    chars = _load_tokenizer("smollm2")(text, add_special_tokens=False, return_offsets_mapping=True)[
        "offset_mapping"][1023][1]
    facts = run_facts(cfg, convs)
    assert f"first 1,024 tokens of the `smollm2` tokenizer, about {chars:,} characters" in facts
    assert 3000 < chars < 4500  # ~3.4 characters per SmolLM2 token on LoCoMo dialogue
    assert "beats the base's strictly" in facts and "drops by more than delta = 0.02" in facts
    llm = run_facts(EvolveConfig(dataset="locomo", extractor="instruction", plan_mode="llm", scorer="llm",
                                 judge_model="hf:smollm2", progress=False))
    assert "Planning: the task model (hf:smollm2) fills the Query" in llm and "official LLM judge (hf:smollm2)" in llm
    assert "Context budget: none" in llm and "EXTRACTION_INSTRUCTION and writes the MemoryUnit list" in llm


def test_the_coder_is_told_the_size_of_every_split_it_is_scored_on():
    from evolution.search.proposers.facts import facts_for

    beam = facts_for(EvolveConfig(dataset="beam", test=["default"], embedder="hash:64", progress=False))
    assert ("  - train (diagnostics and cases): 8 conversations, 33 sessions, 1,974 turns, ~1.1M tokens (largest "
            "conversation: 286 turns, ~169K tokens)") in beam
    assert "  - valid (acceptance): 6 conversations, 26 sessions, 1,668 turns, ~786K tokens" in beam
    # BEAM-1M: the eight test chats, up to ~2,000 messages and ~0.9M tokens each
    assert ("  - test (the frozen program, run once): 8 conversations, 80 sessions, 13,810 turns, ~6.5M tokens "
            "(largest conversation: 1,982 turns, ~911K tokens)") in beam
    cut = EvolveConfig(train=["conv-26"], valid=["conv-30"], test=[""], n_sessions=2, embedder="hash:64")
    sizes = facts_for(cut)
    assert "  - train (diagnostics and cases): 1 conversations, 2 sessions, 35 turns" in sizes
    assert "valid (acceptance): 1 conversations, 2 sessions, 44 turns" in sizes and "  - test" not in sizes
