"""The memory-program contract: structured parsing, schemas, toolkit, seed/reference programs
(in-process; the sandbox has its own tests)."""
from __future__ import annotations

import dataclasses
import hashlib
import math
import re
from dataclasses import dataclass, field
from datetime import datetime
from typing import Optional

import numpy as np
import pytest

from memgym.memory_bank.contract import (OUT_CHAR_BUDGET, BackendToolkitHost, BudgetExceededError, ContractError, SessionInfo,
                                 StructuredOutputError, Toolkit, ToolkitError, contract_from_report,
                                 dataclass_from_schema, describe_dataclass, describe_module, parse_structured,
                                 units_from_entries)
from memgym.memory_bank.programs import reference_program_path, seed_program_path
from memgym.memory_bank.schema import Session, Turn
from tests.helpers import load_program_module


class HashHost:
    """Deterministic test embedder: hashed bag of words in 32 dims; scripted llm."""

    def __init__(self, replies=("reply",)):
        self.replies, self.prompts = list(replies), []

    def embed(self, texts):
        out = np.zeros((len(texts), 32), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()) or ["<empty>"]:
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % 32] += 1
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def llm(self, prompt, max_tokens):
        self.prompts.append((prompt, max_tokens))
        return self.replies[(len(self.prompts) - 1) % len(self.replies)]


@pytest.fixture(scope="module")
def seed():
    return load_program_module(seed_program_path(), "memgym_test_seed")


@pytest.fixture(scope="module")
def ref():
    return load_program_module(reference_program_path(), "memgym_test_reference")


# ------------------------------------------------------------------ parse_structured


def test_parse_list_with_fences_and_coercion(seed):
    text = 'Here you go:\n```json\n[{"content": "Caroline went hiking", "date": "2023-05-07"},\n' \
           ' {"content": 42, "session": "3"}]\n```'
    units = parse_structured(text, seed.MemoryUnit)
    assert units == [seed.MemoryUnit("Caroline went hiking", "2023-05-07"), seed.MemoryUnit("42", session=3)]


def test_parse_single_object_and_wrapper(seed, ref):
    q = parse_structured('{"search_text": "Caroline LGBTQ group", "time_hint": "2023-05"}', ref.Query)
    assert q == ref.Query("Caroline LGBTQ group", "2023-05")
    wrapped = parse_structured('{"units": [{"content": "a"}, {"content": "b"}]}', seed.MemoryUnit, many=True)
    assert [u.content for u in wrapped] == ["a", "b"]
    assert parse_structured('{"content": "only"}', seed.MemoryUnit, many=True) == [seed.MemoryUnit("only")]


@pytest.mark.parametrize("text,field_,index", [
    ('[{"content": "a"}, {"content": "b", "session": "three"}]', "session", 1),
    ('[{"date": "2023-01-01"}]', "content", 0),
    ('[{"content": "a", "mood": "happy"}]', "mood", 0),
    ('[{"content": "a", "session": 2.5}]', "session", 0),
    ('[{"content": "a", "part": ["x"]}]', "part", 0),
    ('["just a string"]', None, 0),
])
def test_parse_errors_name_the_field(seed, text, field_, index):
    with pytest.raises(StructuredOutputError) as ei:
        parse_structured(text, seed.MemoryUnit)
    assert (ei.value.field, ei.value.index, ei.value.schema) == (field_, index, "MemoryUnit")
    assert str(ei.value).startswith(f"MemoryUnit[{index}]")


def test_parse_rejects_nonfinite_and_garbage():
    @dataclass
    class Scored:
        text: str
        score: float = 0.0

    with pytest.raises(StructuredOutputError) as ei:
        parse_structured('{"text": "a", "score": NaN}', Scored)
    assert ei.value.field == "score"
    for bad in ("", "   ", "no json here at all"):
        with pytest.raises(StructuredOutputError) as ei:
            parse_structured(bad, Scored)
        assert ei.value.field is None
    with pytest.raises(StructuredOutputError, match="expected a JSON object, got list"):
        parse_structured('[{"text": "a"}, {"text": "b"}]', Scored, many=False)


# ------------------------------------------------------------------ schemas


def test_describe_dataclass_kinds_and_defaults():
    @dataclass
    class U:
        content: str
        tags: Optional[list[str]] = None
        n: int | None = 3
        flags: list[str] = field(default_factory=lambda: ["x"])
        ok: bool = False

    specs = describe_dataclass(U)
    assert [(s.name, s.kind, s.optional, s.required, s.default) for s in specs] == [
        ("content", "str", False, True, None), ("tags", "list[str]", True, False, None),
        ("n", "int", True, False, 3), ("flags", "list[str]", False, False, ["x"]), ("ok", "bool", False, False, False)]
    rebuilt = dataclass_from_schema("U", specs)
    assert dataclasses.asdict(parse_structured('{"content": "c"}', rebuilt)) == {
        "content": "c", "tags": None, "n": 3, "flags": ["x"], "ok": False}


def test_describe_dataclass_rejections():
    @dataclass
    class BadType:
        content: str
        meta: dict

    @dataclass
    class Empty:
        pass

    @dataclass
    class BadDefault:
        n: int = "seven"

    class NotDc:
        content: str

    for cls, msg in [(BadType, r"BadType\.meta: unsupported type"), (Empty, "at least one field"),
                     (BadDefault, r"BadDefault\.n: default 'seven'"), (NotDc, "must be a dataclass")]:
        with pytest.raises(ContractError, match=msg) as ei:
            describe_dataclass(cls)
        assert ei.value.level == 2


def test_units_from_entries_fills_existing_fields(seed):
    entries = [{"part": "episodic", "id": "E3", "text": "2023-05-07: Support group | Details: ...",
                "date": "2023-05-07", "session": 1},
               {"part": "core", "id": None, "text": "Caroline is a counselor", "date": None, "session": 2}]
    units = units_from_entries(entries, seed.MemoryUnit)
    assert units == [seed.MemoryUnit("2023-05-07: Support group | Details: ...", "2023-05-07", "episodic", "E3", 1),
                     seed.MemoryUnit("Caroline is a counselor", None, "core", None, 2)]

    @dataclass
    class Minimal:
        text: str
        id: Optional[str] = None

    assert units_from_entries(entries[:1], Minimal) == [Minimal("2023-05-07: Support group | Details: ...", "E3")]
    with pytest.raises(StructuredOutputError) as ei:
        units_from_entries([entries[0], {"part": "semantic", "id": "S1"}], seed.MemoryUnit)
    assert (ei.value.index, ei.value.field) == (1, "text")
    with pytest.raises(StructuredOutputError) as ei:
        units_from_entries([{"text": "x", "session": "first"}], seed.MemoryUnit)
    assert (ei.value.index, ei.value.field) == (0, "session")


def test_session_info_from_schema_session():
    s = Session(index=3, id="session_3", date=datetime(2023, 5, 8, 13, 56), date_text="1:56 pm on 8 May, 2023",
                turns=(Turn("D3:1", "Caroline", "hi"),))
    assert SessionInfo.from_session(s).to_dict() == {"index": 3, "id": "session_3", "date": "2023-05-08T13:56:00",
                                                     "date_text": "1:56 pm on 8 May, 2023"}
    undated = Session(index=1, id="s", date=None, date_text="", turns=())
    assert SessionInfo.from_session(undated).to_dict()["date"] is None


# ------------------------------------------------------------------ contract report


def test_contract_report_of_builtin_programs(seed, ref):
    info = contract_from_report(describe_module(seed))
    assert [f.name for f in info.unit_fields] == ["content", "date", "part", "entry_id", "session"]
    assert [f.name for f in info.query_fields] == ["question"]
    assert info.extraction_instruction == seed.EXTRACTION_INSTRUCTION
    info = contract_from_report(describe_module(ref))
    assert [(f.name, f.optional) for f in info.query_fields] == [("search_text", False), ("time_hint", True)]


def test_contract_report_failures(seed):
    rep = describe_module(seed)
    rep["missing"] = ["Memory"]
    with pytest.raises(ContractError, match="does not define Memory") as ei:
        contract_from_report(rep)
    assert ei.value.level == 1
    rep = describe_module(seed)
    rep["instructions"]["PLANNING_INSTRUCTION"] = {"type": "str", "value": "  "}
    with pytest.raises(ContractError, match="PLANNING_INSTRUCTION must be a non-empty str") as ei:
        contract_from_report(rep)
    assert ei.value.level == 2
    rep = describe_module(seed)
    rep["memory"]["methods"]["retrieve"]["async"] = True
    with pytest.raises(ContractError, match="retrieve must be a plain synchronous"):
        contract_from_report(rep)
    rep = describe_module(seed)
    rep["memory"]["methods"]["index"]["params"] = rep["memory"]["methods"]["index"]["params"][:2]
    with pytest.raises(ContractError, match=r"index must accept \(self, units, session\)"):
        contract_from_report(rep)


# ------------------------------------------------------------------ toolkit


def test_toolkit_budget_and_counts():
    host = HashHost(replies=("one", "two"))
    tk = Toolkit(host, llm_budget=2, embed_budget=1)
    assert (tk.llm("p1", max_tokens=8), tk.llm("p2"), tk.budget) == ("one", "two", 0)
    with pytest.raises(BudgetExceededError) as ei:
        tk.llm("p3")
    assert ei.value.kind == "llm"
    assert host.prompts == [("p1", 8), ("p2", 256)]
    vecs = tk.embed(["a b", "c"])
    assert len(vecs) == 2 and all(math.isclose(float(np.linalg.norm(v)), 1.0, rel_tol=1e-5) for v in vecs)
    with pytest.raises(BudgetExceededError):
        tk.embed(["d"])
    assert tk.embed([]) == []
    assert tk.calls == {"llm": 2, "embed": 1, "embed_texts": 2, "refused": 2}


def test_backend_toolkit_host_adapts_llm_protocols():
    from memgym.llm.base import Completion

    class Backend:
        model_id, calls, seen = "fake", 0, []

        def generate(self, batch, params):
            self.seen.append((batch, params.max_new_tokens, params.temperature))
            return [Completion(text="ANSWER")]

    class Embedder:
        dim, calls = 2, 0

        def encode(self, texts):
            return np.array([[3.0, 4.0]] * len(texts), dtype=np.float32)

    backend = Backend()
    tk = Toolkit(BackendToolkitHost(backend, Embedder()), llm_budget=1)
    assert tk.llm("hello", max_tokens=7) == "ANSWER"
    assert backend.seen == [([[{"role": "user", "content": "hello"}]], 7, 0.0)]
    assert tk.embed(["a"]) == [[pytest.approx(0.6), pytest.approx(0.8)]]  # re-normalised


@pytest.mark.parametrize("call,msg", [
    (lambda tk: tk.embed("not a list"), "needs a list of str"),
    (lambda tk: tk.embed(["ok", 3]), r"texts\[1\] is int"),
    (lambda tk: tk.llm(["x"]), "needs a str"),
    (lambda tk: tk.llm("x", max_tokens=0), "max_tokens must be an int"),
    (lambda tk: tk.embed(["x" * 11]), "11 chars > max 10"),
])
def test_toolkit_argument_errors(call, msg):
    with pytest.raises(ToolkitError, match=msg):
        call(Toolkit(HashHost(), llm_budget=5, max_text_chars=10))


def test_cosine_topk_hand_computed():
    m = [[1, 0], [0.6, 0.8], [0, 1], [-1, 0]]
    hits = Toolkit.cosine_topk([1, 0], m, 3)
    assert [i for i, _ in hits] == [0, 1, 2]
    assert [round(s, 6) for _, s in hits] == [1.0, 0.6, 0.0]
    assert Toolkit.cosine_topk([0, 2], [[3, 4]], 5) == [(0, pytest.approx(0.8))]
    assert Toolkit.cosine_topk([1, 0], [], 3) == []
    with pytest.raises(ToolkitError, match="does not match query dim 3"):
        Toolkit.cosine_topk([1, 0, 0], m, 2)


# ------------------------------------------------------------------ seed and reference, in-process


def test_seed_appends_in_order_and_truncates(seed):
    mem = seed.Memory(Toolkit(HashHost()))
    assert mem.index([seed.MemoryUnit("first", "2023-01-02"), seed.MemoryUnit("second")],
                     SessionInfo(1, "s1", "2023-01-05T10:00:00", "").to_dict()) is None
    mem.index([], SessionInfo(2, "s2", None, "8 May 2023").to_dict())
    mem.index([seed.MemoryUnit("third")], SessionInfo(3, "s3", None, "8 May 2023").to_dict())
    assert mem.retrieve(seed.Query("anything")) == "[2023-01-02] first\n[2023-01-05] second\n[8 May 2023] third"
    mem.index([seed.MemoryUnit("x" * 9000), seed.MemoryUnit("y" * 9000)], {"index": 4, "id": "s4", "date": None,
                                                                         "date_text": ""})
    out = mem.retrieve(seed.Query("q"))
    assert len(out) == OUT_CHAR_BUDGET and out.endswith("y")


def test_reference_ranks_packs_and_uses_time_hint(ref):
    host = HashHost()
    mem = ref.Memory(Toolkit(host))
    facts = ["Caroline went to a LGBTQ support group", "Melanie painted a sunrise", "Jon lost his banking job"]
    mem.index([ref.MemoryUnit(f) for f in facts], SessionInfo(1, "s1", "2023-05-08T13:56:00", "").to_dict())
    mem.index([ref.MemoryUnit("Melanie painted a lake", "2023-06-20")], SessionInfo(2, "s2", "2023-06-21T09:00:00",
                                                                                  "").to_dict())
    facts_dated = ["[2023-05-08] " + f for f in facts]
    # every line fits: all are returned, in chronological order
    assert mem.retrieve(ref.Query("Melanie painted")).splitlines() == [
        "[2023-05-08] Caroline went to a LGBTQ support group", "[2023-05-08] Melanie painted a sunrise",
        "[2023-05-08] Jon lost his banking job", "[2023-06-20] Melanie painted a lake"]
    # with a budget for one line only, the best-scoring line wins; the time hint adds TIME_BONUS
    saved = ref.OUT_CHAR_BUDGET
    ref.OUT_CHAR_BUDGET = 52
    try:
        assert mem.retrieve(ref.Query("Caroline LGBTQ support group")) == facts_dated[0]
        assert mem.retrieve(ref.Query("Jon banking job")) == facts_dated[2]
        assert mem.retrieve(ref.Query("Melanie painted a sunrise")) == facts_dated[1]
        assert mem.retrieve(ref.Query("Melanie painted", "2023-06")) == "[2023-06-20] Melanie painted a lake"
        assert mem.retrieve(ref.Query("Melanie painted", "2023-05-08")) == facts_dated[1]
    finally:
        ref.OUT_CHAR_BUDGET = saved
    assert host.prompts == []  # the reference never calls the task LLM inside Memory


def test_reference_budget_packing_skips_long_lines(ref):
    assert ref.pack_lines([0, 1, 2, 3], ["a" * 10, "b" * 30, "c" * 5, "d" * 3], 20) == [0, 2, 3]
    mem = ref.Memory(Toolkit(HashHost()))
    mem.index([ref.MemoryUnit(f"fact {i} " + "z" * 995) for i in range(40)], {"index": 1, "id": "s", "date": None,
                                                                           "date_text": ""})
    out = mem.retrieve(ref.Query("fact"))
    assert len(out) <= OUT_CHAR_BUDGET and len(out.splitlines()) == 15  # 15 lines of 1002-1003 chars fit, 16 do not
    assert ref.Memory(Toolkit(HashHost())).retrieve(ref.Query("x")) == ""
