"""Structured outputs at the clients: the openai backend against the builtin server
(response_format honoured, a refusal or a server that ignores it is one clear error), vLLM's
parameters, eval columns, the ADRPO refusal, and the schemas ``memgym synth`` sends. The schemas
themselves and constrained decoding on the hf backend: test_structured.py."""
from __future__ import annotations

import json
import types
import warnings

import pytest

from memgym.llm.base import GenerationParams
from memgym.llm.structured import ConstraintRefusedError, JsonSchema, bounded
from memgym.memory_bank.action_schemas import manager_schema, prompt_schema
from memgym.memory_bank.actions import parse_output
from tests.helpers import ScriptedBackend
from tests.llm.test_structured import _ids_used, _manager_prompts


def test_openai_response_format_reaches_the_builtin_server(tiny):
    from memgym.llm.openai_backend import OpenAIBackend
    from memgym.llm.server import serve_backend

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
    from memgym.llm.openai_backend import OpenAIBackend
    from memgym.llm.server import serve_backend
    from memgym.rewards.scoring.judge import JUDGE_SCHEMA

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
    from memgym.llm.vllm_backend import structured_params
    from memgym.rewards.scoring.judge import JUDGE_SCHEMA

    class SOP:
        def __init__(self, json):
            self.json = json

    new = types.SimpleNamespace(sampling_params=types.SimpleNamespace(StructuredOutputsParams=SOP))
    kw = structured_params(new, JUDGE_SCHEMA)
    assert list(kw) == ["structured_outputs"] and kw["structured_outputs"].json == JUDGE_SCHEMA.as_dict()
    old = types.SimpleNamespace(sampling_params=types.SimpleNamespace(GuidedDecodingParams=SOP))
    assert structured_params(old, JUDGE_SCHEMA)["guided_decoding"].json == dict(JUDGE_SCHEMA.schema)


def test_eval_columns_say_whether_constrained():
    from memgym.evolution.evaluation.eval_job import EvalConfig, parse_column

    assert parse_column("hf:smollm2", False) == ("hf:smollm2", False, "hf:smollm2")
    assert parse_column("hf:smollm2 constrained", False) == ("hf:smollm2", True, "hf:smollm2 (constrained)")
    assert parse_column("hf:smollm2 free", True) == ("hf:smollm2", False, "hf:smollm2")
    assert parse_column("expert:conv-30", True) == ("expert:conv-30", False, "expert:conv-30")
    with pytest.raises(ValueError, match="'constrained' or 'free'"):
        EvalConfig(compare=["hf:smollm2 strict"])
    with pytest.raises(ValueError, match="cannot be constrained"):
        EvalConfig(compare=["expert:conv-30 constrained"])


def test_adrpo_refuses_constrained_rollouts(tmp_path):
    from memgym.training.adrpo_config import ADRPOConfig, ADRPOConfigError

    with pytest.raises(ADRPOConfigError, match="own distribution"):
        ADRPOConfig(output_dir=str(tmp_path / "o"), use_cpu=True, bf16=False, report_to="none", constrained=True)


def test_json_schema_checks_its_name_and_compares_by_content():
    with pytest.raises(ValueError, match="name"):
        JsonSchema("bad name!", {"type": "object"})
    a, b = JsonSchema("x", {"type": "object"}), JsonSchema("x", {"type": "object"})
    assert a == b and hash(a) == hash(b) and a != JsonSchema("x", {"type": "array"})
    assert json.loads(a.canonical) == {"type": "object"}


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

    from memgym.data_synth.locomo import load_locomo
    from memgym.data_synth.trajectories import synth_trajectories
    from memgym.memory_bank.prompts import core_block_lines
    from tests.data_synth.test_trajectories import EXPERT, replaying_expert, session_and_manager
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
    narrowed = 0
    for messages, schema in zip(seen, flat):
        session, m = session_and_manager(messages)
        shown = tuple(re.findall(r"^\[([ESP]\d+)\] ", messages[1]["content"], flags=re.M))
        if m != "core":
            assert schema == manager_schema(m, shown)
            assert compiler.accepts(schema, EXPERT[(session, m)])
            continue
        # core: REPLACE's old_text is narrowed to the lines of the core block shown (issue 19)
        block = messages[1]["content"].split("Current core block:\n", 1)[1].split("\n\nNew session transcript", 1)[0]
        lines = core_block_lines("" if block == "(empty)" else block)
        assert schema == manager_schema("core", None, lines)
        out = json.loads(EXPERT[(session, m)])
        if out["operation"] != "REPLACE" or out["old_text"] in lines:
            assert compiler.accepts(schema, EXPERT[(session, m)])
            continue
        # the expert replaces part of a line: that exact output cannot be decoded any more, the
        # same edit as a whole-line REPLACE can, and gives the same core block
        line = next(ln for ln in lines if out["old_text"] in ln)
        whole = {"operation": "REPLACE", "old_text": line, "new_text": line.replace(out["old_text"], out["new_text"], 1)}
        assert not compiler.accepts(schema, EXPERT[(session, m)])
        assert compiler.accepts(schema, json.dumps(whole))
        assert block.replace(whole["old_text"], whole["new_text"], 1) == block.replace(out["old_text"],
                                                                                         out["new_text"], 1)
        narrowed += 1
    assert narrowed == 2  # sessions 2 and 3 of conv-30: the expert REPLACEs part of a line


def test_synth_qa_constrained_sends_the_qa_schema(tmp_path, compiler):
    from memgym.data_synth.locomo import load_locomo
    from memgym.data_synth.synth_qa import synth_qa
    from memgym.data_synth.synth_qa_prompt import QA_SCHEMA
    from memgym.data_synth.qa_format import KINDS
    from memgym.llm.embeddings import HashEmbedder
    from tests.helpers import ScriptedBackend

    reply = json.dumps({"qa": [{"question": "Who?", "answer": "Jon", "evidence": ["D1:1"], "kind": "single-session"}]})
    be = SchemaRecorder(ScriptedBackend(lambda m, p: reply))
    conv = load_locomo(ids=["conv-30"])[0]
    synth_qa([conv], tmp_path / "qa.jsonl", backend=be, embedder=HashEmbedder(64), j=1, n_sessions=1,
             progress=False, constrained=True)
    assert be.schemas == [[QA_SCHEMA]]
    assert compiler.accepts(QA_SCHEMA, reply)
    assert QA_SCHEMA.schema["$defs"]["_QAOut"]["properties"]["kind"]["enum"] == list(KINDS)


class SchemaIgnoringBackend(ScriptedBackend):
    """A model behind a server without structured outputs: the schema is accepted and ignored."""

    def generate(self, batch, params, schemas=None):
        return super().generate(batch, params)


def _ask(url: str, schema):
    from memgym.llm.openai_backend import OpenAIBackend

    client = OpenAIBackend(url, "m", max_retries=0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        out = client.generate([[{"role": "user", "content": "core?"}]], GenerationParams(max_new_tokens=32),
                              schemas=[schema])
    return client, out[0].text, [str(w.message) for w in caught]


def test_a_server_that_ignores_response_format_is_named():
    from memgym.llm.server import serve_backend
    from memgym.memory_bank.action_schemas import manager_schema

    schema = manager_schema("core")
    for reply, ignored in (("Sure! Here is the update you asked for.", 1), ('{"operation": "NONE"}', 0)):
        server, _, url = serve_backend(SchemaIgnoringBackend([reply], model_id="m"), served_model_name="m")
        try:
            client, text, caught = _ask(url, schema)
        finally:
            server.shutdown()
            server.server_close()
        assert text == reply and client.schema_ignored == ignored
        named = [m for m in caught if "outside the JSON schema" in m]
        if ignored:
            assert named == [f"OpenAIBackend: the server {url} (model 'm') returned output outside the JSON schema "
                             "'memgym_core' it was sent as response_format (not JSON: 'Sure! Here is the update you "
                             "asked for.'): it ignores structured outputs, so the parse/schema failures that follow "
                             "are the server's, not the model's. Use a server that honours response_format (vLLM, "
                             "SGLang) or set `constrained: false`."]
        else:
            assert named == []


def test_schema_mismatch_reads_the_manager_schemas():
    from memgym.llm.openai_backend import schema_mismatch
    from memgym.memory_bank.action_schemas import manager_schema

    core = manager_schema("core", None, ("Jon: dancer.", "Gina: lost her job.")).schema
    assert schema_mismatch('{"operation": "REPLACE", "old_text": "Jon: dancer.", "new_text": "Jon: studio owner."}',
                           core) == ""
    assert schema_mismatch('{"operation": "REPLACE", "old_text": "Jon", "new_text": "x"}', core) == \
        "$ matches none of its 4 alternatives"
    part = manager_schema("episodic", ("E1",)).schema
    assert schema_mismatch('{"operations": [{"action": "DELETE", "id": "E1"}]}', part) == ""
    assert schema_mismatch('{"operations": [{"action": "DELETE", "id": "E2"}]}', part) == \
        "$.operations[0] matches none of its 3 alternatives"
    assert schema_mismatch('{"operations": []}', part) == ""
    assert schema_mismatch('{"ops": []}', part) == "$ lacks 'operations'"
