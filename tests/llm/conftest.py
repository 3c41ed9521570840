"""Fixtures of the structured-output tests (tests/llm/test_structured*.py): the schema compiler
over SmolLM2's real tokenizer and the tiny random-weight model behind the hf backend."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def compiler():
    from transformers import AutoTokenizer

    from memgym.llm.grammar import SchemaCompiler
    from memgym.llm.models import prepare_smollm2_tokenizer

    tok = AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))
    return SchemaCompiler(tok, [tok.eos_token_id])


@pytest.fixture(scope="module")
def tiny(tiny_model_dir):
    from memgym.llm.hf_backend import HFBackend

    return HFBackend(tiny_model_dir, batch_size=8)
