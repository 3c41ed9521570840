"""Segmented SFT examples (training/sft_segments.py): turn packing, the IDF word-overlap
assignment of expert operations to segments (hand-computed), the rows of conv-26's first two
sessions (real expert trajectory, SmolLM2's tokenizer), the no-change cap, and the SFT data
split built with ``segment_tokens``."""
from __future__ import annotations

import json
from collections import Counter

import pytest

from memgym.data_synth.paths import expert_dir
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.schema import Session, Turn
from memgym.training.sft_data import expert_session_states
from memgym.memory_bank.construct import ModelExtractor, construct, split_session
from memgym.training.sft_segments import SegmentError, assign_texts, cap_empty, is_empty_output, segment_rows, words

CONV26 = expert_dir() / "conv-26.jsonl"


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    from memgym.training.common import load_tokenizer

    return load_tokenizer(tiny_model_dir)  # SmolLM2's real tokenizer


def _session(n: int) -> Session:
    return Session(1, "s1", None, "1 May 2023", tuple(Turn(f"D1:{i}", "A", f"turn {i}") for i in range(1, n + 1)))


def test_split_session_packs_whole_turns():
    s = _session(5)
    segs = split_session(s, [50, 80, 100, 30, 250], 200)
    assert [[t.id for t in g.turns] for g in segs] == [["D1:1", "D1:2"], ["D1:3", "D1:4"], ["D1:5"]]
    assert all(g.index == 1 and g.date_text == "1 May 2023" for g in segs)
    assert split_session(s, [50, 80, 100, 30, 250], 510) == [s]  # fits: the session itself
    assert [len(g.turns) for g in split_session(s, [300] * 5, 200)] == [1] * 5  # over-long turns stay whole
    with pytest.raises(ValueError, match="segment_tokens must be >= 1"):
        split_session(s, [1] * 5, 0)
    with pytest.raises(ValueError, match="4 turn lengths for 5 turns"):
        split_session(s, [1] * 4, 10)


def test_assign_texts_by_idf_weighted_word_overlap():
    segs = ["Alice baked bread with flour", "Alice went hiking in the mountains"]
    assert words("Alice baked a loaf, 2 times!") == {"alice", "baked", "loaf", "times"}
    # alice is in both segments (weight log(2/2) = 0); baked/bread weigh log 2 in segment 0 only
    assert assign_texts(["Alice baked bread", "Alice: hiking", "Alice", "bread and hiking"], segs) == [0, 1, 1, 0]
    # three segments: segment 0 scores log 1.5 (alice) + log 3 (flour) = 1.50, segment 1 2 log 1.5 = 0.81
    three = ["alice flour", "alice went", "went out"]
    assert assign_texts(["alice went flour"], three) == [0]
    assert assign_texts(["went alice"], three) == [1]
    assert assign_texts(["out"], three) == [2]
    with pytest.raises(ValueError, match="no segments"):
        assign_texts(["x"], [])


def test_segment_rows_of_conv26_sessions_1_2_carry_every_expert_operation(tokenizer):
    states = expert_session_states([CONV26])[:2]
    rows, stats = segment_rows(states, tokenizer=tokenizer, segment_tokens=200)
    assert stats.to_json() == {"sessions": 2, "segments": 7, "ops": 18, "unshown": 0,
                               "segments_per_session": {"conv-26/1": 3, "conv-26/2": 4}}
    assert len(rows) == 7 * 4
    assert [(r["session"], r["segment"], r["segments"]) for r in rows[::4]] == [
        (1, 1, 3), (1, 2, 3), (1, 3, 3), (2, 1, 4), (2, 2, 4), (2, 3, 4), (2, 4, 4)]
    # every prompt shows exactly its segment's turns
    first = [r["prompt"][1]["content"].split("New session transcript:\n")[1].split("]")[0] + "]" for r in rows[::4]]
    assert first == ["[D1:1]", "[D1:7]", "[D1:13]", "[D2:1]", "[D2:5]", "[D2:9]", "[D2:13]"]
    for st in states:
        mine = [r for r in rows if r["session"] == st.session.index]
        for part in ("episodic", "semantic", "procedural"):
            got = [op for r in mine if r["manager"] == part
                   for op in json.loads(r["completion"][0]["content"])["operations"]]
            assert Counter(json.dumps(o, sort_keys=True) for o in got) == Counter(
                json.dumps(o, sort_keys=True) for o in st.step.outputs[part]["operations"])
        lines = [ln for r in mine if r["manager"] == "core"
                 for ln in json.loads(r["completion"][0]["content"]).get("content", "").splitlines()]
        assert sorted(lines) == sorted(ln for ln in st.step.outputs["core"]["content"].splitlines() if ln.strip())
    ops = {(r["session"], r["segment"], r["manager"]): json.loads(r["completion"][0]["content"]) for r in rows}
    assert ops[(1, 1, "core")] == {"operation": "NONE"}
    assert ops[(1, 2, "core")]["content"].startswith("Caroline: close friend of Melanie")
    assert ops[(1, 3, "core")]["content"].startswith('Melanie ("Mel"): close friend of Caroline')
    assert [o["memory"][:13] for o in ops[(1, 1, "episodic")]["operations"]] == ["2023-05-07: C", "2023-05-08: M"]
    assert [o["action"] for o in ops[(2, 1, "semantic")]["operations"]] == ["UPDATE"]
    assert ops[(2, 4, "episodic")] == {"operations": []}
    # the segments of session 1 rebuild the expert's bank after session 1 (same entries)
    bank = MemoryBank()
    for r in rows[:12]:
        bank.apply_text(r["manager"], r["completion"][0]["content"], 1)
    after = states[1].bank_before
    for part in ("episodic", "semantic", "procedural"):
        assert sorted(e.text for e in bank.entries(part)) == sorted(e.text for e in after.entries(part))
    assert sorted(bank.core.splitlines()) == sorted(ln for ln in after.core.splitlines() if ln.strip())
    only = segment_rows(states[:1], tokenizer=tokenizer, segment_tokens=200, managers=["episodic"])[0]
    assert [r["manager"] for r in only] == ["episodic"] * 3


def test_inference_with_segment_tokens_cuts_sessions_as_sft_does(tokenizer):
    """An extractor with segment_tokens 200 shows the managers the same segments (first turn of
    each) that segment_rows trained on: conv-26 sessions 1 and 2, 3 + 4 segments."""
    from memgym.llm.base import GenerationParams
    from memgym.memory_bank.schema import Conversation
    from tests.helpers import ScriptedBackend

    states = expert_session_states([CONV26])[:2]
    backend = ScriptedBackend(lambda m, p: '{"operation": "NONE"}' if "Your part is CORE" in m[0]["content"]
                              else '{"operations": []}')
    backend.tokenizer = tokenizer
    conv = Conversation("conv-26", ("Caroline", "Melanie"), tuple(st.session for st in states), ())
    built = construct(conv, ModelExtractor(backend, GenerationParams(max_new_tokens=64), segment_tokens=200))
    assert built.segments == {1: 3, 2: 4} and len(backend.seen) == 7 * 4
    first = [m[1]["content"].split("New session transcript:\n")[1].split("]")[0] + "]" for m, _ in backend.seen[::4]]
    assert first == ["[D1:1]", "[D1:7]", "[D1:13]", "[D2:1]", "[D2:5]", "[D2:9]", "[D2:13]"]  # = segment_rows'
    whole = ScriptedBackend(backend._responses)
    assert construct(conv, ModelExtractor(whole, GenerationParams(max_new_tokens=64))).segments == {1: 1, 2: 1}
    with pytest.raises(ValueError, match="segment_tokens must be >= 1"):
        ModelExtractor(whole, segment_tokens=0)


def test_segment_rows_name_the_session_whose_operations_do_not_apply(tokenizer):
    st = expert_session_states([CONV26])[1]
    st.step.outputs["semantic"]["operations"].append({"action": "UPDATE", "id": "S99", "memory": "Melanie - x"})
    rows, stats = segment_rows([st], tokenizer=tokenizer, segment_tokens=200)
    assert stats.unshown == 1  # no prompt shows S99: the operation is dropped, the rest kept
    assert stats.ops == 10 and sum(len(json.loads(r["completion"][0]["content"])["operations"])
                                   for r in rows if r["manager"] == "semantic") == 5
    bad = expert_session_states([CONV26])[0]
    bad.step.outputs["core"] = {"operation": "REPLACE", "old_text": "not in the core", "new_text": "x"}
    with pytest.raises(SegmentError, match=r"conv-26 session 1 segment 3/3, core"):
        segment_rows([bad], tokenizer=tokenizer, segment_tokens=200)


def test_cap_empty_keeps_at_most_n_no_change_rows_per_manager():
    from datasets import Dataset

    def row(m, out):
        return {"manager": m, "completion": [{"role": "assistant", "content": json.dumps(out)}]}

    none, empty, add = {"operation": "NONE"}, {"operations": []}, {"operations": [{"action": "ADD", "memory": "x"}]}
    ds = Dataset.from_list([row("core", none)] * 3 + [row("core", {"operation": "APPEND", "content": "a"})]
                           + [row("procedural", empty)] * 5 + [row("episodic", add)] * 2 + [row("episodic", empty)])
    assert is_empty_output("core", json.dumps(none)) and not is_empty_output("episodic", json.dumps(add))
    kept, dropped = cap_empty(ds, 1, seed=0)
    assert dropped == {"core": 2, "procedural": 4}
    assert Counter((r["manager"], is_empty_output(r["manager"], r["completion"][0]["content"])) for r in kept) == {
        ("core", True): 1, ("core", False): 1, ("procedural", True): 1, ("episodic", False): 2, ("episodic", True): 1}
    assert cap_empty(ds, None, 0) == (ds, {})
    assert len(cap_empty(ds, 0, 0)[0]) == 3
    with pytest.raises(ValueError, match="max_per_manager must be >= 0"):
        cap_empty(ds, -1, 0)


def test_sft_build_data_with_segments(tmp_path, tokenizer):
    """The SFT split of conv-26 sessions 1-2 (a trajectory file of their two lines), segmented."""
    from memgym.training.sft import SFTScriptArguments, build_data

    traj = tmp_path / "conv-26-s12.jsonl"
    traj.write_text("".join(CONV26.read_text().splitlines(keepends=True)[:2]))
    args = SFTScriptArguments(train_trajectories=[str(traj)], eval_trajectories=[], embedder="none",
                              segment_tokens=200, max_empty_per_manager=1)
    data = build_data(args, tokenizer, max_length=4096, seed=0, progress=False)
    # 28 rows, all within 4096 tokens; no-change rows: core 3 (NONE), procedural 6, episodic 1, semantic 1
    assert data.lengths["train"]["kept"] == 28 and data.lengths["train"]["dropped"] == 0
    assert data.lengths["train"]["empty_dropped"] == {"core": 2, "procedural": 5}
    assert data.lengths["train"]["used"] == len(data.train) == 21
    assert data.lengths["train_segments"]["segments"] == 7
    assert set(data.train.column_names) >= {"prompt", "completion", "manager", "segment"}
    with pytest.raises(ValueError, match="segment_tokens"):
        SFTScriptArguments(segment_tokens=0)
