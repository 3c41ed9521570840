"""memory_bank/programs/bank.py, MemBuilder's four-part bank as a memory program: it passes the
four validation levels, and run by the program runner over conv-30's expert replay its
retrieved text equals, question by question, what memgym.memory_bank.retrieval.BankRetriever renders
from the bank that construct builds (cut to the answer model's 6000 characters), deletions
and merges included."""
from __future__ import annotations

from memgym.data_synth.datasets import load_conversations
from memgym.data_synth.extractors import make_extractor
from memgym.evolution.execution.runner import ProgramRunner, RunnerSettings
from memgym.evolution.execution.validate import ValidationLimits, validate_program
from memgym.llm.embeddings import HashEmbedder
from memgym.llm.runtime import Runtime
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.construct import construct
from memgym.memory_bank.contract import session_entries, units_from_entries
from memgym.memory_bank.programs import bank_program_path, read_program_source
from memgym.memory_bank.retrieval import BankRetriever, program_vectors
from memgym.rewards.scoring.answer import truncate_context


def test_bank_program_passes_the_four_validation_levels():
    res = validate_program(read_program_source(bank_program_path()), None, ValidationLimits())
    assert res.ok, res.reason
    assert res.stats["levels_passed"] == [1, 2, 3, 4]


def test_bank_program_retrieves_what_bank_retriever_renders():
    rt = Runtime(embedder=HashEmbedder(64))
    (conv,) = load_conversations("locomo", None, ids=["conv-30"], n_sessions=6)
    built = construct(conv, make_extractor("expert:conv-30", rt), embedder=rt.embedder)
    want = [truncate_context(r.render(), 6000)
            for r in BankRetriever(built.bank, rt.embedder, 10).retrieve([q.question for q in conv.questions])]
    runner = ProgramRunner(rt, RunnerSettings(extractor="expert:conv-30", plan_mode="question",
                                              scorer="answer-recall", diagnostics=False))
    run = runner.run(read_program_source(bank_program_path()), [conv])
    assert len(run.tasks) == len(conv.questions) == 44  # the QA with all evidence in the first 6 sessions
    assert [t.retrieved for t in run.tasks] == want


class _Toolkit:
    def __init__(self, embedder):
        self.embedder = embedder

    def embed(self, texts):
        return program_vectors(self.embedder.encode(list(texts))).tolist()  # as the sandbox hands them over


def test_bank_program_replays_merges_deletions_and_core_rewrites():
    """Hand-written manager outputs over two sessions: session 2 merges E1 and E2 into E1,
    deletes E3, updates S1 and adds E4, rewrites the core; the program, given each session's
    entries (removals included), holds the same bank and retrieves what BankRetriever renders."""
    emb = HashEmbedder(64)
    bank = MemoryBank()
    bank.apply_text("core", '{"operation": "APPEND", "content": "Ann is a nurse."}', 1)
    bank.apply_text("episodic", '{"operations": [{"action": "ADD", "memory": "2023-05-08: Ann adopted a cat"}, '
                                '{"action": "ADD", "memory": "Ann named the cat Miso"}, '
                                '{"action": "ADD", "memory": "Bob bought a red bike"}]}', 1)
    bank.apply_text("semantic", '{"operations": [{"action": "ADD", "memory": "Bob likes cycling"}]}', 1)
    snap1 = bank.to_json()
    bank.apply_text("core", '{"operation": "REWRITE", "content": "Ann is a nurse in Boston."}', 2)
    bank.apply_text("episodic", '{"operations": [{"action": "MERGE", "ids": ["E1", "E2"], "memory": '
                                '"2023-05-08: Ann adopted a cat named Miso"}, {"action": "DELETE", "id": "E3"}, '
                                '{"action": "ADD", "memory": "Bob sold his bike"}]}', 2)
    bank.apply_text("semantic", '{"operations": [{"action": "UPDATE", "id": "S1", "memory": "Bob liked cycling"}]}', 2)
    snap2 = bank.to_json()
    assert [e.id for e in bank.entries("episodic")] == ["E1", "E4"]
    import sys
    import types

    module = types.ModuleType("memgym_bank_program")
    sys.modules[module.__name__] = module  # typing.get_type_hints looks the annotations up there
    exec(compile(read_program_source(bank_program_path()), "bank.py", "exec"), module.__dict__)  # noqa: S102
    ns = module.__dict__
    mem = ns["Memory"](_Toolkit(emb))
    for i, (before, after) in enumerate(((None, snap1), (snap1, snap2)), start=1):
        entries = session_entries(before, after, i, None, deletions=True)
        mem.index(units_from_entries(entries, ns["MemoryUnit"]), {"index": i})
    s2 = session_entries(snap1, snap2, 2, None, deletions=True)
    assert sorted((e["id"], e.get("deleted", False)) for e in s2) == [("E1", False), ("E2", True), ("E3", True),
                                                                       ("E4", False), ("S1", False),
                                                                       ("core", False)]
    # a program without a `deleted` field never sees the removals
    assert len(units_from_entries(s2, _NoDeleted)) == 4
    assert mem.core == "Ann is a nurse in Boston."
    assert mem.parts == {"episodic": {"E1": "2023-05-08: Ann adopted a cat named Miso", "E4": "Bob sold his bike"},
                         "semantic": {"S1": "Bob liked cycling"}, "procedural": {}}
    questions = ["What is the cat called?", "What did Bob do with the bike?"]
    want = [r.render() for r in BankRetriever(bank, emb, 10).retrieve(questions)]
    assert [mem.retrieve(ns["Query"](q)) for q in questions] == want


from dataclasses import dataclass  # noqa: E402


@dataclass
class _NoDeleted:
    content: str
    part: str | None = None
    entry_id: str | None = None
