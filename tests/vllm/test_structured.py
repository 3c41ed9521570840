"""Structured outputs through vLLM: the four managers' schemas (memgym.memory_bank.action_schemas, ids
and core lines narrowed to the prompt) constrain SmolLM2 in the in-process engine
(``StructuredOutputsParams``) and on the server (``response_format`` json_schema); every output
parses, validates and uses only shown ids, as the hf constrained path's do
(tests/llm/test_structured.py), with 0 format failures, and the same greedy outputs both ways."""
from __future__ import annotations

import pytest

from memgym.llm.base import GenerationParams
from memgym.llm.structured import bounded
from memgym.memory_bank.action_schemas import prompt_schema
from memgym.memory_bank.actions import MANAGERS, parse_output
from tests.llm.test_structured import _ids_used, _manager_prompts

pytestmark = pytest.mark.vllm


def _check(prompts, comps) -> list:
    ops = []
    for p, c in zip(prompts, comps):
        assert c.finish_reason == "stop", (p.manager, c.text[:200])
        parsed = parse_output(p.manager, c.text)  # raises on any parse / schema / wrong-part error
        if p.manager != "core":
            assert set(_ids_used(parsed)) <= set(p.shown_ids), (p.manager, c.text)
        ops.append(parsed)
    return ops


def test_managers_schemas_constrain_vllm_in_process_and_served(vllm_base, vllm_server):
    from memgym.llm.openai_backend import OpenAIBackend

    prompts = _manager_prompts()
    assert [p.manager for p in prompts] == list(MANAGERS) and all(len(p.shown_ids) >= 2 for p in prompts[1:3])
    schemas = [bounded(prompt_schema(p), max_chars=80, max_items=3) for p in prompts]
    batch = [p.messages for p in prompts]
    served = OpenAIBackend(vllm_server.base_url, vllm_server.base_model, max_concurrency=4)
    greedy = GenerationParams(max_new_tokens=400, temperature=0)
    local = vllm_base.generate(batch, greedy, schemas=schemas)
    remote = served.generate(batch, greedy, schemas=schemas)
    assert [c.text for c in local] == [c.text for c in remote]
    _check(prompts, local)
    free = vllm_base.generate(batch, GenerationParams(max_new_tokens=400, temperature=0))
    assert [c.text for c in free] != [c.text for c in local]  # the schema changed what was written
    used = set()
    for seed in range(3):  # sampled, both engines: 24 outputs, 0 format failures
        params = GenerationParams(max_new_tokens=400, temperature=1.0, seed=seed)
        for backend in (vllm_base, served):
            for p, parsed in zip(prompts, _check(prompts, backend.generate(batch, params, schemas=schemas))):
                if p.manager != "core":
                    used |= set(_ids_used(parsed))
    assert used  # shown ids were actually used
