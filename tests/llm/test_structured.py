"""Structured outputs: manager / record / judge schemas, constrained decoding on the hf backend
(llguidance), the response cache and the program runner under constraint. The clients (openai
backend and builtin server, vLLM, eval columns, ADRPO, synth): test_structured_clients.py."""
from __future__ import annotations

import pytest

from memgym.data_synth.expert import banks_before_sessions, load_trajectories, replay
from memgym.data_synth.paths import expert_dir
from memgym.llm.base import Completion, GenerationParams
from memgym.llm.cache import CachedBackend, ResponseCache
from memgym.llm.structured import bounded
from memgym.memory_bank.action_schemas import manager_schema, prompt_schema
from memgym.memory_bank.actions import MANAGERS, Delete, Merge, Update, parse_output
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.errors import ManagerOutputError
from memgym.memory_bank.contract import FieldSpec, parse_structured
from memgym.memory_bank.prompts import build_prompt
from memgym.memory_bank.record_schemas import query_schema, units_schema
from memgym.memory_bank.schema import Session, Turn


# ------------------------------------------------------------------ manager schemas


def test_manager_schema_accepts_every_expert_output(compiler):
    """All 2 x 19 sessions x 4 managers of the shipped trajectories, ids narrowed to the ids
    the bank holds before each session."""
    n = 0
    for name in ("conv-26", "conv-30"):
        steps = load_trajectories(expert_dir() / f"{name}.jsonl")
        banks = banks_before_sessions(steps)
        for step in steps:
            bank = banks[(step.conversation_id, step.session)]
            for m in MANAGERS:
                ids = None if m == "core" else tuple(bank.parts[m])
                assert compiler.accepts(manager_schema(m, ids), step.output_text(m)), (name, step.session, m)
                n += 1
    assert n == 152


# The malformed examples of tests/memory_bank/test_bank.py::test_typed_errors (bank: core "Alice", no entries).
MALFORMED = [
    ("core", ""), ("core", "no json here at all"), ("core", '{"operation": "APPEND"}'),
    ("core", '{"operations": []}'),
    ("episodic", '{"operations": [{"action": "UPDATE", "id": "E9", "memory": "m"}]}'),
    ("episodic", '{"operations": [{"action": "UPDATE", "id": "S1", "memory": "m"}]}'),
    ("episodic", '{"operations": [{"action": "FLY", "memory": "m"}]}'),
    ("semantic", '{"operations": [{"action": "ADD"}]}'), ("semantic", '{"operation": "NONE"}'),
    ("procedural", '{"operations": [{"action": "MERGE", "ids": ["P1"], "memory": "m"}]}'),
]


@pytest.mark.parametrize("manager,text", MALFORMED)
def test_manager_schema_rejects_the_malformed_bank_examples(compiler, manager, text):
    assert not compiler.accepts(manager_schema(manager, None if manager == "core" else ()), text)


def test_replace_text_not_found_is_left_to_validation(compiler):
    """The one bank-test example a schema cannot express: REPLACE's old_text must occur in the
    core block (bank state, not shape). The schema accepts it; applying it still fails."""
    text = '{"operation": "REPLACE", "old_text": "zzz", "new_text": "q"}'
    assert compiler.accepts(manager_schema("core"), text)
    b = MemoryBank()
    b.apply_text("core", '{"operation":"APPEND","content":"Alice"}', 1)
    with pytest.raises(ManagerOutputError):
        b.apply_text("core", text, 2)


def test_schema_shapes_follow_the_shown_ids(compiler):
    def actions(s):
        return [b["$ref"].rsplit("/", 1)[1] for b in s.schema["properties"]["operations"]["items"]["anyOf"]]

    assert actions(manager_schema("episodic", ())) == ["Add"]
    assert actions(manager_schema("episodic", ("E2",))) == ["Add", "Update", "Delete"]
    assert actions(manager_schema("episodic", ("E2", "E5"))) == ["Add", "Update", "Merge", "Delete"]
    assert actions(manager_schema("episodic")) == ["Add", "Update", "Merge", "Delete"]  # ids unrestricted
    s = manager_schema("semantic", ("S1", "S4"))
    assert compiler.accepts(s, '{"operations": [{"action": "MERGE", "ids": ["S4", "S1"], "memory": "m"}]}')
    assert not compiler.accepts(s, '{"operations": [{"action": "DELETE", "id": "S2"}]}')
    assert manager_schema("semantic", ("S1", "S4")) is s  # built once per shape
    assert s.response_format()["json_schema"]["name"] == "memgym_semantic"
    with pytest.raises(ValueError, match="S<n>"):
        manager_schema("semantic", ("E1",))
    with pytest.raises(ValueError, match="no entry ids"):
        manager_schema("core", ("E1",))
    b = bounded(s, max_chars=10, max_items=2)
    assert compiler.accepts(b, '{"operations": [{"action": "ADD", "memory": "0123456789"}]}')
    assert not compiler.accepts(b, '{"operations": [{"action": "ADD", "memory": "0123456789X"}]}')
    assert bounded(s, 10, 2) is b and bounded(s) is s


# ------------------------------------------------------------------ hf constrained decoding


def _manager_prompts():
    """The four manager prompts of a new session over the expert bank after conv-30 session 3
    (its episodic prompt shows E-ids, semantic S-ids)."""
    bank = replay(expert_dir() / "conv-30.jsonl", upto_session=3)
    session = Session(4, "session_4", None, "3 June 2023", (
        Turn("D4:1", "Gina", "I opened my online clothing store last week and sold ten dresses."),
        Turn("D4:2", "Jon", "Congrats! I am rehearsing a new dance routine for the studio opening.")))
    return [build_prompt(m, bank, session) for m in MANAGERS]


def _ids_used(ops):
    return [i for op in ops for i in (op.ids if isinstance(op, Merge) else [op.id] if isinstance(op, (Update, Delete))
                                      else [])]


def test_tiny_model_constrained_always_parses_and_validates_free_does_not(tiny):
    prompts = _manager_prompts()
    assert all(len(p.shown_ids) >= 2 for p in prompts[1:3])
    schemas = [bounded(prompt_schema(p), max_chars=24, max_items=3) for p in prompts]
    free_fail = constrained_ok = 0
    used = set()
    for seed in range(8):
        params = GenerationParams(max_new_tokens=900, temperature=1.0, seed=seed)
        comps = tiny.generate([p.messages for p in prompts], params, schemas=schemas)
        for p, c in zip(prompts, comps):
            assert c.finish_reason == "stop", (seed, p.manager, c.text[:200])
            ops = parse_output(p.manager, c.text)  # raises on any parse / schema / wrong-part error
            ids = _ids_used(ops) if p.manager != "core" else []
            assert set(ids) <= set(p.shown_ids), (seed, p.manager, ids)
            used |= set(ids)
            constrained_ok += 1
        free = tiny.generate([p.messages for p in prompts], GenerationParams(max_new_tokens=48, temperature=1.0,
                                                                             seed=seed))
        for p, c in zip(prompts, free):
            try:
                parse_output(p.manager, c.text)
            except ManagerOutputError:
                free_fail += 1
    assert constrained_ok == 32
    assert free_fail == 32  # a random-weight model never writes a valid output unconstrained
    assert used  # shown ids were actually used


def test_batches_mix_schemas_and_free_rows_and_greedy_works(tiny):
    prompts = _manager_prompts()
    s = bounded(prompt_schema(prompts[1]), 16, 2)
    comps = tiny.generate([prompts[1].messages, prompts[1].messages], GenerationParams(max_new_tokens=600),
                          schemas=[s, None])
    parse_output("episodic", comps[0].text)
    with pytest.raises(ManagerOutputError):
        parse_output("episodic", comps[1].text)
    # the same row alone gives the same greedy text: the mask of one row does not touch another
    alone = tiny.generate([prompts[1].messages], GenerationParams(max_new_tokens=600), schemas=[s])
    assert alone[0].text == comps[0].text


def test_token_limit_gives_finish_reason_length(tiny):
    p = _manager_prompts()[1]
    c = tiny.generate([p.messages], GenerationParams(max_new_tokens=6), schemas=[prompt_schema(p)])[0]
    assert c.finish_reason == "length" and c.completion_tokens == 6
    assert c.text.startswith('{"operations": ')  # a prefix of a valid document, cut off


def test_cache_key_includes_the_schema():
    class Recorder:
        model_id, calls = "rec", 0

        def __init__(self):
            self.seen = []

        def generate(self, batch, params, schemas=None):
            self.seen.append(schemas)
            self.calls += len(batch)
            return [Completion(text="{}" if s is None else '{"label": "WRONG"}') for s in (schemas or [None] * len(batch))]

    from memgym.rewards.scoring.judge import JUDGE_SCHEMA

    inner = Recorder()
    cb = CachedBackend(inner, ResponseCache(":memory:"))
    msgs = [{"role": "user", "content": "x"}]
    p = GenerationParams(max_new_tokens=8)
    assert cb.generate([msgs], p)[0].text == "{}"
    assert cb.generate([msgs], p, schemas=[JUDGE_SCHEMA])[0].text == '{"label": "WRONG"}'
    assert cb.generate([msgs], p, schemas=[JUDGE_SCHEMA])[0].cached
    assert cb.generate([msgs], p)[0].text == "{}"
    assert (cb.hits, cb.misses) == (2, 2)
    assert inner.seen == [None, [JUDGE_SCHEMA]]  # free requests reach the backend without schemas


# ------------------------------------------------------------------ judge, records, runner


def test_constrained_judge_always_parses(tiny):
    from memgym.rewards.scoring.judge import LLMJudge

    items = [(f"What did Gina sell in week {i}?", "dresses", f"answer {i}") for i in range(6)]
    free = LLMJudge(tiny, GenerationParams(max_new_tokens=16)).judge(items)
    assert not any(v.parse_ok for v in free)
    verdicts = LLMJudge(tiny, GenerationParams(max_new_tokens=16), constrained=True).judge(items)
    assert all(v.parse_ok for v in verdicts) and {v.raw for v in verdicts} <= {'{"label": "CORRECT"}',
                                                                               '{"label": "WRONG"}'}


def test_record_schemas_follow_the_program_dataclasses(compiler):
    fields = (FieldSpec("content", "str"), FieldSpec("tags", "list[str]", optional=True, required=False),
              FieldSpec("session", "int", optional=True, required=False))
    u = units_schema(fields)
    assert u.schema["properties"]["units"]["items"]["required"] == ["content", "tags", "session"]
    assert units_schema(list(fields)) is u
    assert compiler.accepts(u, '{"units": [{"content": "a", "tags": null, "session": 3}]}')
    assert not compiler.accepts(u, '{"units": [{"content": "a", "tags": null}]}')
    q = query_schema((FieldSpec("search_text", "str"), FieldSpec("k", "float")))
    assert compiler.accepts(q, '{"search_text": "x", "k": 0.5}') and not compiler.accepts(q, '{"search_text": 1}')
    from memgym.memory_bank.contract import dataclass_from_schema

    cls = dataclass_from_schema("MemoryUnit", list(fields))
    assert parse_structured('{"units": [{"content": "a", "tags": null, "session": 3}]}', cls, many=True)[0].session == 3


def test_runner_plans_and_units_parse_under_constraint_with_the_tiny_model(tiny):
    from memgym.evolution.execution.runner import ProgramRunner, RunnerSettings
    from memgym.llm.embeddings import HashEmbedder
    from memgym.memory_bank.programs import read_program_source, reference_program_path
    from memgym.llm.runtime import Runtime
    from tests.helpers import TASK, conversation

    def run(constrained):
        rt = Runtime(embedder=HashEmbedder(dim=64))
        rt.register(TASK, tiny)
        s = RunnerSettings(extractor="instruction", task_model=TASK, constrained=constrained, diagnostics=False,
                           constrained_max_chars=16, constrained_max_items=2, extract_max_new_tokens=1200,
                           plan_max_new_tokens=200, answer_max_new_tokens=4)
        runner = ProgramRunner(rt, s)
        return runner, runner.run(read_program_source(reference_program_path()), [conversation()])

    _, res = run(True)
    assert res.extraction["sessions"] == 3 and res.extraction["format_failures"] == 0
    assert res.plan_failures == 0
    _, free = run(False)
    assert free.extraction["format_failures"] == 3 and free.plan_failures == 4
