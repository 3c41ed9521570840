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

from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.api import evolve
from memgym.evolution.search.journal import load_archive
from memgym.evolution.search.proposers.facts import run_facts
from memgym.evolution.search.proposers.replay import ReplayMismatchError, load_recording
from tests.evolution.search.competent_coder import serve_coder

SMALL = dict(train=["conv-26"], valid=["conv-30"], n_sessions=2, max_questions=6, extractor="turns",
             rounds_integrate=0, plan_mode="question", scorer="answer-recall", probe_units=200, probe_batches=10,
             progress=False, embedder="hash:256", context_tokens=256, context_tokenizer="smollm2", rounds_cold=3,
             rounds_refine=2)


def _fingerprint(run: Path):
    return load_archive(run).fingerprint()


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    root = tmp_path_factory.mktemp("rec")
    server, spec = serve_coder()
    try:
        cfg = EvolveConfig(**SMALL, proposer="coder", coder_model=spec, out=str(root / "run"))
        from memgym.launch.cli import main
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
    from memgym.launch.cli import main

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
    from memgym.launch.cli import main

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
    from memgym.data_synth.datasets import load_conversations
    from memgym.rewards.scoring.context_budget import _load_tokenizer

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
    from memgym.evolution.search.proposers.facts import facts_for

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


def _copy(run: Path, dst: Path) -> Path:
    shutil.copytree(run, dst, ignore=shutil.ignore_patterns("*.sqlite*", ".lock"))
    return dst


def _edit_reply(run: Path, round_no: int, edit, rehash: bool = False) -> None:
    """Apply ``edit(response entry)`` to the first recorded reply of round ``round_no``."""
    from memgym.evolution.search.proposers.coder import reply_sha256

    p = run / "candidates" / f"r{round_no:02d}" / "proposal.json"
    prop = json.loads(p.read_text())
    entry = next(e for e in prop["result"]["transcript"] if e["role"] == "response")
    edit(entry)
    if rehash:
        entry["sha256"] = reply_sha256(entry["content"])
    p.write_text(json.dumps(prop))


def _replay_error(run: Path, out: Path, capsys, started: bool = False) -> str:
    """The one stderr line of a replay of ``run`` that must stop with exit 2 (``started``: after
    its first rounds, which stay in ``out``; else before anything ran, leaving nothing there)."""
    from memgym.launch.cli import main

    capsys.readouterr()
    assert main(["evolve", "--proposer", "replay", "--from", str(run), "--out", str(out)]) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning:")]
    assert len(err) == 1 and err[0].startswith("memgym evolve: ") and out.exists() == started, err
    return err[0]


def test_replay_refuses_edited_reply(recorded, tmp_path, capsys):
    run, _ = recorded
    bad = _copy(run, tmp_path / "bad")
    # the attacker's edit: the first reply's edit block replaced, the request untouched
    _edit_reply(bad, 1, lambda e: e.update(content=e["content"].replace("RRF_K = 60", "RRF_K = 1")))
    err = _replay_error(bad, tmp_path / "r", capsys)
    assert err == (f"memgym evolve: round 1, turn 1: the recorded reply in {bad}/candidates/r01/proposal.json does not "
                   "match its sha256: it was edited or damaged after the run")
    # a recording without reply hashes cannot be checked: refused the same way
    _edit_reply(bad, 1, lambda e: e.pop("sha256"))
    err = _replay_error(bad, tmp_path / "r", capsys)
    assert err.startswith("memgym evolve: round 1, turn 1: ") and "has no sha256, so it cannot be checked" in err


def test_replay_refuses_a_rehashed_edit_by_the_candidate_it_makes(recorded, tmp_path, capsys):
    run, _ = recorded
    bad = _copy(run, tmp_path / "bad")
    # round 3's reply edited and its sha256 recomputed: the requests still match, the program does not
    _edit_reply(bad, 3, lambda e: e.update(content=e["content"].replace("for j in (i - 1, i):", "for j in (i, i - 1):")),
                rehash=True)
    err = _replay_error(bad, tmp_path / "r", capsys, started=True)
    assert err.startswith(f"memgym evolve: round 3: candidate r03 differs from the recording in {bad} ")
    assert "in its program key: " in err and " recorded, " in err and err.endswith(" replayed")
    # every candidate as recorded, the final archive not (its base edited in the recorded state.json)
    other = _copy(run, tmp_path / "other")
    st = json.loads((other / "state.json").read_text())
    assert st["archive"]["base"] != "seed" and st["next_round"] == 6
    st["archive"]["base"] = "seed"
    (other / "state.json").write_text(json.dumps(st))
    err = _replay_error(other, tmp_path / "r2", capsys, started=True)
    assert err == ("memgym evolve: round 5: the archive after the recording's last round differs from the recording "
                   f"in {other} in its base")


def test_replay_refuses_invalid_recorded_token_counts(recorded, tmp_path, capsys):
    run, _ = recorded
    for key, value, why in (("completion_tokens", "12abc", "'12abc' is not an integer"),
                            ("prompt_tokens", -10 ** 9, "-1,000,000,000 is negative"),
                            ("prompt_tokens", True, "True is not an integer"),
                            ("completion_tokens", 10 ** 9, "1,000,000,000 is above the possible 4,096")):
        bad = _copy(run, tmp_path / f"bad-{key}-{value}")
        _edit_reply(bad, 2, lambda e: e.update({key: value}))
        err = _replay_error(bad, tmp_path / "r", capsys)
        assert err == (f"memgym evolve: round 2, turn 1: the recorded reply in {bad}/candidates/r02/proposal.json has "
                       f"an invalid {key}: {why}")


def test_replay_estimates_missing_recorded_token_counts_and_marks_them(recorded, tmp_path):
    from memgym.evolution.search.proposers.replay import load_recording
    from memgym.launch.cli import main
    from memgym.llm.models import estimate_tokens

    run, _ = recorded
    gap = _copy(run, tmp_path / "gap")
    _edit_reply(gap, 1, lambda e: [e.pop("prompt_tokens"), e.pop("completion_tokens")])
    req, resp = load_recording(gap)[1]["propose"][0]
    want = estimate_tokens(req["messages"], resp["content"])
    words = load_recording(run)[1]["propose"][0][1]  # the fake server counts whitespace words
    prompt_bytes = sum(len(m["content"].encode()) for m in req["messages"])
    assert words["prompt_tokens"] < want[0] < prompt_bytes and words["completion_tokens"] < want[1] < len(resp["content"])
    out = tmp_path / "replay"
    assert main(["evolve", "--proposer", "replay", "--from", str(gap), "--out", str(out)]) == 0
    assert _fingerprint(out) == _fingerprint(run)
    s = json.loads((out / "summary.json").read_text())
    assert s["ledger"]["1"]["coder"] == {"calls": 1, "prompt": want[0], "completion": want[1], "estimated": 1}
    assert s["estimated_calls"] == {"coder": 1}
    assert "- **estimated token counts**: coder 1 call (the server's or the recording's counts" in \
        (out / "report.md").read_text()
    replayed = json.loads((out / "candidates/r01/proposal.json").read_text())["result"]["transcript"][1]
    assert replayed["estimated"] is True and replayed["prompt_tokens"] == want[0]


def test_a_server_reporting_negative_usage_cannot_switch_off_the_coder_budget(tmp_path):
    """A coder server whose ``usage`` says -1,000,000,000 prompt and 5,000 completion tokens
    (above coder_max_new_tokens): its counts are not taken, the SmolLM2 estimates are, marked; the
    coder budget of 1,000 tokens stops the run after round 1, as with an honest server."""
    from memgym.launch.cli import main
    from tests.helpers import FaultyServer

    server, spec = serve_coder(server_class=FaultyServer, usage={"prompt_tokens": -1_000_000_000,
                                                                 "completion_tokens": 5000})
    (tmp_path / "recipe.yaml").write_text("\n".join(f"{k}: {json.dumps(v)}" for k, v in SMALL.items()))
    out = tmp_path / "run"
    try:
        assert main(["evolve", "--config", str(tmp_path / "recipe.yaml"), "--proposer", "coder", "--coder_model", spec,
                     "--budgets", "coder=1000", "--out", str(out)]) == 0
    finally:
        server.shutdown()
        server.server_close()
    s = json.loads((out / "summary.json").read_text())
    assert s["rounds"] == 1 and s["stopped"].startswith("budget of role 'coder' exhausted")
    (req, resp), = load_recording(out)[1]["propose"]
    from memgym.llm.models import estimate_tokens
    want = estimate_tokens(req["messages"], resp["content"])
    assert s["ledger"]["1"]["coder"] == {"calls": 1, "prompt": want[0], "completion": want[1], "estimated": 1}
    assert want[0] > 1000 and s["tokens"]["coder"] == {"prompt": want[0], "completion": want[1]}
    assert s["estimated_calls"] == {"coder": 1} and resp["estimated"] is True
    report = (out / "report.md").read_text()
    assert f"| 1 | {sum(want):,} | 0 | 0 | 0 | 0 | {sum(want):,} |" in report
    assert "- **estimated token counts**: coder 1 call" in report
