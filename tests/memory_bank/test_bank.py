"""Memory bank: action space, atomic apply, replay of the shipped expert files, prompts,
retrieval and construction."""
from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st

from memgym.data_synth.expert import TrajectoryError, banks_before_sessions, load_trajectories, replay
from memgym.data_synth.paths import expert_dir
from memgym.memory_bank.actions import parse_core, parse_part
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.construct import ModelExtractor, construct
from memgym.memory_bank.errors import (ManagerOutputError, OutputParseError, OutputSchemaError, ReplaceTextNotFoundError,
                                UnknownIdError, WrongPartError)
from memgym.memory_bank.prompts import MAX_SHOWN_ENTRIES, build_prompt
from memgym.memory_bank.retrieval import BankRetriever, VectorIndex
from memgym.memory_bank.schema import Conversation, Session, Turn
from tests.helpers import ScriptedBackend


def _expert(name):
    return expert_dir() / f"{name}.jsonl"


def _independent_counts(path):
    """Counts computed straight from the file (ADDs minus DELETEs and MERGE removals)."""
    n = {"episodic": 0, "semantic": 0, "procedural": 0}
    for line in open(path):
        d = json.loads(line)
        for p in n:
            for op in d[p]["operations"]:
                n[p] += {"ADD": 1, "DELETE": -1}.get(op["action"], 0) - (len(op["ids"]) - 1 if op["action"] == "MERGE" else 0)
    return n


@pytest.mark.parametrize("name,expected", [
    ("conv-26", {"sessions": 19, "core_chars": 3258, "episodic": 90, "semantic": 63, "procedural": 3}),
    ("conv-30", {"sessions": 19, "core_chars": 2712, "episodic": 52, "semantic": 45, "procedural": 8}),
])
def test_expert_files_replay_exactly(name, expected):
    bank = replay(_expert(name))
    assert bank.summary() == expected
    assert bank.counts() == _independent_counts(_expert(name))
    # every UPDATE in the file is visible: the entry's final text is the last text written to it
    last = {}
    for line in open(_expert(name)):
        d = json.loads(line)
        for p in ("episodic", "semantic", "procedural"):
            for op in d[p]["operations"]:
                if op["action"] == "UPDATE":
                    last[op["id"]] = op["memory"]
    for id_, text in last.items():
        part = {"E": "episodic", "S": "semantic", "P": "procedural"}[id_[0]]
        assert bank.parts[part][id_].text == text
    # JSON round trip is exact
    assert MemoryBank.loads(bank.dumps()).dumps() == bank.dumps()


def test_replay_names_the_failing_line(tmp_path):
    lines = open(_expert("conv-30")).read().splitlines()
    bad = json.loads(lines[2])
    bad["semantic"]["operations"] = [{"action": "UPDATE", "id": "S999", "memory": "x"}]
    lines[2] = json.dumps(bad)
    p = tmp_path / "t.jsonl"
    p.write_text("\n".join(lines))
    with pytest.raises(TrajectoryError) as e:
        replay(p)
    assert e.value.line == 3 and e.value.field == "semantic" and "unknown_id" in str(e.value)


def test_banks_before_sessions_are_prefix_replays():
    steps = load_trajectories(_expert("conv-26"))
    before = banks_before_sessions(steps)
    assert before[("conv-26", 1)].counts() == {"episodic": 0, "semantic": 0, "procedural": 0}
    assert before[("conv-26", 5)].dumps() == replay(steps[:4]).dumps()


def test_ids_assigned_in_order_and_never_reused():
    b = MemoryBank()
    b.apply_text("episodic", '{"operations":[{"action":"ADD","memory":"a"},{"action":"ADD","memory":"b"}]}', 1)
    b.apply_text("episodic", '{"operations":[{"action":"DELETE","id":"E2"}]}', 2)
    r = b.apply_text("episodic", '{"operations":[{"action":"ADD","memory":"c"}]}', 3)
    assert r.added == ["E3"] and [e.id for e in b.entries("episodic")] == ["E1", "E3"]


def test_update_and_merge_keep_history():
    b = MemoryBank()
    b.apply_text("semantic", '{"operations":[{"action":"ADD","memory":"x1"},{"action":"ADD","memory":"y1"}]}', 1)
    b.apply_text("semantic", '{"operations":[{"action":"UPDATE","id":"S1","memory":"x2"}]}', 2)
    b.apply_text("semantic", '{"operations":[{"action":"MERGE","ids":["S1","S2"],"memory":"xy"}]}', 3)
    (e,) = b.entries("semantic")
    assert (e.id, e.text, e.created, e.updated) == ("S1", "xy", 1, 3)
    assert e.history == [(1, "x1"), (1, "[S2] y1"), (2, "x2")]


def test_core_ops_and_compression_hook():
    b = MemoryBank(core_limit=20, core_target=10, compressor=lambda text, target: "SHORT")
    b.apply_text("core", '{"operation":"APPEND","content":"Alice: teacher"}', 1)
    assert b.core == "Alice: teacher"
    b.apply_text("core", '{"operation":"REPLACE","old_text":"teacher","new_text":"nurse"}', 2)
    assert b.core == "Alice: nurse"
    r = b.apply_text("core", '{"operation":"APPEND","content":"Bob: plays guitar every day"}', 3)
    assert r.core_compressed and b.core == "SHORT"


@pytest.mark.parametrize("manager,text,err", [
    ("core", "", OutputParseError),
    ("core", "no json here at all", OutputParseError),
    ("core", '{"operation":"REPLACE","old_text":"zzz","new_text":"q"}', ReplaceTextNotFoundError),
    ("core", '{"operation":"APPEND"}', OutputSchemaError),
    ("core", '{"operations":[]}', WrongPartError),
    ("episodic", '{"operations":[{"action":"UPDATE","id":"E9","memory":"m"}]}', UnknownIdError),
    ("episodic", '{"operations":[{"action":"UPDATE","id":"S1","memory":"m"}]}', WrongPartError),
    ("episodic", '{"operations":[{"action":"FLY","memory":"m"}]}', OutputSchemaError),
    ("semantic", '{"operations":[{"action":"ADD"}]}', OutputSchemaError),
    ("semantic", '{"operation":"NONE"}', WrongPartError),
    ("procedural", '{"operations":[{"action":"MERGE","ids":["P1"],"memory":"m"}]}', OutputSchemaError),
])
def test_typed_errors(manager, text, err):
    b = MemoryBank()
    b.apply_text("core", '{"operation":"APPEND","content":"Alice"}', 1)
    with pytest.raises(err):
        b.apply_text(manager, text, 2)


def test_tolerant_parsing_fences_prose_and_damage():
    assert parse_core('```json\n{"operation": "NONE"}\n```').operation == "NONE"
    ops = parse_part('Here you go:\n{"operations": [{"action": "add", "memory": "x"}]}\nThanks!', "semantic")
    assert ops[0].action == "ADD" and ops[0].memory == "x"
    ops = parse_part('{"operations": [{"action": "ADD", "memory": "x"},]}', "episodic")  # trailing comma
    assert len(ops) == 1


def _seed_bank():
    b = replay(_expert("conv-30"), upto_session=3)
    return b


_op = st.fixed_dictionaries({
    "action": st.sampled_from(["ADD", "UPDATE", "MERGE", "DELETE", "BAD"]),
    "id": st.sampled_from(["E1", "E2", "E999", "S1", "x"]),
    "ids": st.lists(st.sampled_from(["E1", "E2", "E3", "E999"]), max_size=3),
    "memory": st.text(max_size=20),
})


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(_op, min_size=1, max_size=6), junk=st.text(max_size=30),
       manager=st.sampled_from(["episodic", "semantic", "procedural", "core"]))
def test_invalid_output_leaves_bank_byte_identical(ops, junk, manager):
    bank = _seed_bank()
    before = bank.dumps()
    for text in (json.dumps({"operations": ops}), junk, json.dumps({"operation": junk, "old_text": junk})):
        try:
            bank.apply_text(manager, text, 4)
        except ManagerOutputError:
            assert bank.dumps() == before
        else:
            before = bank.dumps()  # it was valid: the new state is the reference


def test_prompt_shows_at_most_20_relevant_entries_with_ids():
    bank = replay(_expert("conv-26"))
    assert len(bank.entries("episodic")) == 90
    s = Session(20, "s20", None, "1 Jan 2024", (Turn("D20:1", "Caroline", "I went to the LGBTQ support group again"),))

    class OneHot:
        dim, calls = 3, 0

        def encode(self, texts):
            v = np.array([[1.0, 0, 0] if "support group" in t else [0, 1.0, 0] for t in texts], dtype=np.float32)
            return v

    p = build_prompt("episodic", bank, s, embedder=OneHot())
    assert len(p.shown_ids) == MAX_SHOWN_ENTRIES
    user = p.messages[1]["content"]
    shown_lines = [line for line in user.splitlines() if line.startswith("[E")]
    assert len(shown_lines) == 20
    # every entry that mentions the support group is ranked in
    sg = {e.id for e in bank.entries("episodic") if "support group" in e.text}
    assert 0 < len(sg) <= 20 and sg <= set(p.shown_ids)
    assert "1 Jan 2024" in user and "[D20:1] Caroline" in user
    assert build_prompt("core", bank, s).shown_ids == ()


def test_vector_index_topk_matches_brute_force():
    rng = np.random.default_rng(0)
    m = rng.normal(size=(500, 16)).astype(np.float32)
    idx = VectorIndex(16)
    idx.add(m[:200])
    idx.add(m[200:])
    q = rng.normal(size=(3, 16)).astype(np.float32)
    got, scores = idx.search(q, 10)
    want = np.argsort(-(q @ m.T), axis=1)[:, :10]
    assert (got == want).all()
    assert np.allclose(scores, np.take_along_axis(q @ m.T, want, axis=1))
    with pytest.raises(ValueError):
        idx.add(np.zeros((2, 5)))


def test_retrieval_counts_per_part():
    b = MemoryBank()
    b.apply_text("episodic", '{"operations":[{"action":"ADD","memory":"cat one"},{"action":"ADD","memory":"dog"}]}', 1)
    b.apply_text("semantic", '{"operations":[{"action":"ADD","memory":"cat two"}]}', 1)
    b.apply_text("procedural", '{"operations":[{"action":"ADD","memory":"cat three"}]}', 1)

    class Kw:
        dim, calls = 2, 0

        def encode(self, texts):
            v = np.array([[1.0, 0.1] if "cat" in t else [0.1, 1.0] for t in texts], dtype=np.float32)
            return v / np.linalg.norm(v, axis=1, keepdims=True)

    (r,) = BankRetriever(b, Kw(), k=3).retrieve(["where is the cat"])
    assert r.counts == {"episodic": 1, "semantic": 1, "procedural": 1}
    assert "dog" not in r.render()


def test_construct_counts_format_failures_and_snapshots():
    conv = Conversation("c", ("A", "B"), tuple(
        Session(i, f"s{i}", None, f"day {i}", (Turn(f"D{i}:1", "A", f"hello {i}"),)) for i in (1, 2)))
    outputs = {
        "core": '{"operation": "APPEND", "content": "A says hello"}',
        "episodic": '{"operations": [{"action": "ADD", "memory": "2023-01-01: hello | Details: x"}]}',
        "semantic": "I don't know",
        "procedural": '{"operations": []}',
    }

    def respond(messages, params):
        for m, text in outputs.items():
            if f"for the {m} part" in messages[-1]["content"]:
                return text
        raise AssertionError("unknown prompt")

    backend = ScriptedBackend(respond)
    res = construct(conv, ModelExtractor(backend))
    assert backend.calls == 8 and len(res.snapshots) == 2
    assert {f.manager for f in res.failures} == {"semantic"} and len(res.failures) == res.attempts["semantic"] == 2
    assert res.bank.counts() == {"episodic": 2, "semantic": 0, "procedural": 0}
    assert res.snapshots[0]["episodic"][0]["id"] == "E1" and res.bank.core == "A says hello\nA says hello"


def test_core_replace_is_narrowed_to_the_lines_of_the_block():
    from memgym.llm.grammar import SchemaCompiler
    from memgym.llm.models import prepare_smollm2_tokenizer
    from memgym.memory_bank.action_schemas import prompt_schema
    from memgym.memory_bank.bank import MemoryBank
    from memgym.memory_bank.prompts import build_prompt
    from memgym.memory_bank.schema import Session, Turn
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))
    compiler = SchemaCompiler(tok, [tok.eos_token_id])
    session = Session(index=2, id="s2", date=None, date_text="8 May 2023", turns=(Turn("D2:1", "Jon", "Hi"),))
    bank = MemoryBank()
    bank.core = "Jon: banker.\n\nGina: lost her job at Door Dash."
    prompt = build_prompt("core", bank, session)
    assert prompt.core_lines == ("Jon: banker.", "Gina: lost her job at Door Dash.")
    schema = prompt_schema(prompt)
    old = schema.schema["$defs"]["CoreReplace"]["properties"]["old_text"]
    assert old == {"enum": ["Jon: banker.", "Gina: lost her job at Door Dash."], "title": "Old Text", "type": "string"}
    ok = '{"operation": "REPLACE", "old_text": "Jon: banker.", "new_text": "Jon: dance studio owner."}'
    absent = '{"operation": "REPLACE", "old_text": "Jon: banker at a bank.", "new_text": "x"}'
    assert compiler.accepts(schema, ok) and not compiler.accepts(schema, absent)
    assert compiler.accepts(schema, '{"operation": "APPEND", "content": "Gina: opened a store."}')
    empty = prompt_schema(build_prompt("core", MemoryBank(), session))
    assert [b["$ref"] for b in empty.schema["anyOf"]] == ["#/$defs/CoreAppend", "#/$defs/CoreRewrite",
                                                          "#/$defs/CoreNone"]
    assert not compiler.accepts(empty, ok)
