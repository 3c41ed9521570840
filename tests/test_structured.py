"""Structured outputs: manager / record / judge schemas, constrained decoding on the hf backend
(llguidance), the response cache, the openai backend against the builtin server (response_format
honoured, a refusal is one clear error), vLLM's parameters, the program runner, eval columns and
the ADRPO refusal."""
from __future__ import annotations

import json
import types

import pytest

from data_synth.expert import banks_before_sessions, load_trajectories, replay
from data_synth.paths import expert_dir
from llm.base import Completion, GenerationParams
from llm.cache import CachedBackend, ResponseCache
from llm.structured import ConstraintRefusedError, JsonSchema, bounded
from memory_bank.action_schemas import manager_schema, prompt_schema
from memory_bank.actions import MANAGERS, Delete, Merge, Update, parse_output
from memory_bank.bank import MemoryBank
from memory_bank.errors import ManagerOutputError
from memory_bank.program import FieldSpec, parse_structured
from memory_bank.prompts import build_prompt
from memory_bank.record_schemas import query_schema, units_schema
from memory_bank.schema import Session, Turn


@pytest.fixture(scope="module")
def compiler():
    from transformers import AutoTokenizer

    from llm.grammar import SchemaCompiler
    from llm.models import prepare_smollm2_tokenizer

    tok = AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))
    return SchemaCompiler(tok, [tok.eos_token_id])


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from llm.hf_backend import HFBackend

    return HFBackend(tiny_model_dir, batch_size=8)


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


# The malformed examples of tests/test_bank.py::test_typed_errors (bank: core "Alice", no entries).
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

    from rewards.judge import JUDGE_SCHEMA

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
    from rewards.judge import LLMJudge

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
    from memory_bank.program import dataclass_from_schema

    cls = dataclass_from_schema("MemoryUnit", list(fields))
    assert parse_structured('{"units": [{"content": "a", "tags": null, "session": 3}]}', cls, many=True)[0].session == 3


def test_runner_plans_and_units_parse_under_constraint_with_the_tiny_model(tiny):
    from evolution.execution.runner import ProgramRunner, RunnerSettings
    from llm.embeddings import HashEmbedder
    from memory_bank.programs import read_program_source, reference_program_path
    from llm.runtime import Runtime
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


# ------------------------------------------------------------------ openai, vllm, eval, adrpo


def test_openai_response_format_reaches_the_builtin_server(tiny):
    from llm.openai_backend import OpenAIBackend
    from llm.server import serve_backend

    prompt = _manager_prompts()[2]
    schema = bounded(prompt_schema(prompt), 16, 2)
    server, _, url = serve_backend(tiny, served_model_name="tiny")
    try:
        be = OpenAIBackend(url, "tiny", max_retries=0)
        c = be.generate([prompt.messages], GenerationParams(max_new_tokens=600), schemas=[schema])[0]
        assert server.response_formats == [schema.response_format()]
        ops = parse_output("semantic", c.text)  # the server decoded under the schema
        assert set(_ids_used(ops)) <= set(prompt.shown_ids)
        be.generate([prompt.messages], GenerationParams(max_new_tokens=4))
        assert server.response_formats[-1] is None
    finally:
        server.shutdown()
        server.server_close()


def test_a_server_that_refuses_response_format_gives_one_clear_error(tiny):
    from llm.openai_backend import OpenAIBackend
    from llm.server import serve_backend
    from rewards.judge import JUDGE_SCHEMA

    server, _, url = serve_backend(tiny, served_model_name="tiny", structured_outputs=False)
    try:
        be = OpenAIBackend(url, "tiny", max_retries=3, backoff_base_s=0)
        with pytest.raises(ConstraintRefusedError) as e:
            be.generate([[{"role": "user", "content": "x"}]], GenerationParams(max_new_tokens=4),
                        schemas=[JUDGE_SCHEMA])
        msg = str(e.value)
        assert url in msg and "judge_verdict" in msg and "constrained: false" in msg
        assert e.value.attempts == 1 and server.requests_total == 1  # not retried, no silent free retry
    finally:
        server.shutdown()
        server.server_close()


def test_vllm_structured_params_use_the_same_schema():
    from llm.vllm_backend import structured_params
    from rewards.judge import JUDGE_SCHEMA

    class SOP:
        def __init__(self, json):
            self.json = json

    new = types.SimpleNamespace(sampling_params=types.SimpleNamespace(StructuredOutputsParams=SOP))
    kw = structured_params(new, JUDGE_SCHEMA)
    assert list(kw) == ["structured_outputs"] and kw["structured_outputs"].json == JUDGE_SCHEMA.as_dict()
    old = types.SimpleNamespace(sampling_params=types.SimpleNamespace(GuidedDecodingParams=SOP))
    assert structured_params(old, JUDGE_SCHEMA)["guided_decoding"].json == dict(JUDGE_SCHEMA.schema)


def test_eval_columns_say_whether_constrained():
    from rewards.evaluate import EvalConfig, parse_column

    assert parse_column("hf:smollm2", False) == ("hf:smollm2", False, "hf:smollm2")
    assert parse_column("hf:smollm2 constrained", False) == ("hf:smollm2", True, "hf:smollm2 (constrained)")
    assert parse_column("hf:smollm2 free", True) == ("hf:smollm2", False, "hf:smollm2")
    assert parse_column("expert:conv-30", True) == ("expert:conv-30", False, "expert:conv-30")
    with pytest.raises(ValueError, match="'constrained' or 'free'"):
        EvalConfig(compare=["hf:smollm2 strict"])
    with pytest.raises(ValueError, match="cannot be constrained"):
        EvalConfig(compare=["expert:conv-30 constrained"])


def test_adrpo_refuses_constrained_rollouts(tmp_path):
    from training.adrpo_config import ADRPOConfig, ADRPOConfigError

    with pytest.raises(ADRPOConfigError, match="own distribution"):
        ADRPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none", constrained=True)


def test_json_schema_checks_its_name_and_compares_by_content():
    with pytest.raises(ValueError, match="name"):
        JsonSchema("bad name!", {"type": "object"})
    a, b = JsonSchema("x", {"type": "object"}), JsonSchema("x", {"type": "object"})
    assert a == b and hash(a) == hash(b) and a != JsonSchema("x", {"type": "array"})
    assert json.loads(a.canonical) == {"type": "object"}


# ------------------------------------------------------------------ synth qa / trajectories


class SchemaRecorder:
    """Wraps a ScriptedBackend; records the schemas of every generate call."""

    def __init__(self, inner):
        self.inner, self.model_id, self.schemas = inner, inner.model_id, []

    @property
    def calls(self):
        return self.inner.calls

    def generate(self, batch, params, schemas=None):
        self.schemas.append(schemas)
        return self.inner.generate(batch, params)


def test_synth_trajectories_constrained_sends_each_prompts_schema(tmp_path, compiler):
    import re

    from data_synth.locomo import load_locomo
    from data_synth.trajectories import synth_trajectories
    from tests.test_synth_trajectories import EXPERT, replaying_expert, session_and_manager
    from tests.helpers import ScriptedBackend

    seen = []

    def expert(messages, params):
        seen.append(messages)
        return replaying_expert(messages, params)

    be = SchemaRecorder(ScriptedBackend(expert))
    conv = load_locomo(ids=["conv-30"])[0]
    stats = synth_trajectories([conv], tmp_path / "t.jsonl", backend=be, n_sessions=3, progress=False, constrained=True)
    assert stats.sessions_written == 3 and len(be.schemas) == 3
    flat = [s for call in be.schemas for s in call]
    for messages, schema in zip(seen, flat):
        session, m = session_and_manager(messages)
        shown = tuple(re.findall(r"^\[([ESP]\d+)\] ", messages[1]["content"], flags=re.M))
        assert schema == manager_schema(m, None if m == "core" else shown)
        assert compiler.accepts(schema, EXPERT[(session, m)])


def test_synth_qa_constrained_sends_the_qa_schema(tmp_path, compiler):
    from data_synth.locomo import load_locomo
    from data_synth.synth_qa import QA_SCHEMA, synth_qa
    from data_synth.qa_format import KINDS
    from llm.embeddings import HashEmbedder
    from tests.helpers import ScriptedBackend

    reply = json.dumps({"qa": [{"question": "Who?", "answer": "Jon", "evidence": ["D1:1"], "kind": "single-session"}]})
    be = SchemaRecorder(ScriptedBackend(lambda m, p: reply))
    conv = load_locomo(ids=["conv-30"])[0]
    synth_qa([conv], tmp_path / "qa.jsonl", backend=be, embedder=HashEmbedder(64), j=1, n_sessions=1,
             progress=False, constrained=True)
    assert be.schemas == [[QA_SCHEMA]]
    assert compiler.accepts(QA_SCHEMA, reply)
    assert QA_SCHEMA.schema["$defs"]["_QAOut"]["properties"]["kind"]["enum"] == list(KINDS)
