"""Backend spec parsing and load_backend."""
from __future__ import annotations

import importlib.util

import pytest

from memgym.llm.base import BackendSpecError, GenerationParams
from memgym.llm.cache import CachedBackend, ResponseCache
from memgym.llm.errors import ConfigError
from memgym.llm.hf_backend import HFBackend
from memgym.llm.openai_backend import OpenAIBackend
from memgym.llm.specs import BackendSpec, load_backend, parse_spec, resolve_model_path


@pytest.mark.parametrize("spec, parsed", [
    ("hf:/models/x", BackendSpec("hf", "/models/x")),
    ("hf:smollm2", BackendSpec("hf", "smollm2")),
    ("vllm:runs/sft/final", BackendSpec("vllm", "runs/sft/final")),
    ("openai:http://127.0.0.1:8000/v1#Qwen3-32B", BackendSpec("openai", "http://127.0.0.1:8000/v1", "Qwen3-32B")),
    ("openai:https://api.example.com/v1#org/model#2", BackendSpec("openai", "https://api.example.com/v1#org/model", "2")),
    ("openai:http://h1:8000/v1,http://h2:8000/v1#Qwen3-32B",
     BackendSpec("openai", "http://h1:8000/v1,http://h2:8000/v1", "Qwen3-32B")),
])
def test_parse_valid(spec, parsed):
    assert parse_spec(spec) == parsed


@pytest.mark.parametrize("spec, fragment", [
    ("smollm2", "malformed"),
    ("hf:", "empty path"),
    ("gguf:/x", "unknown kind 'gguf'"),
    ("openai:http://127.0.0.1:8000/v1", "must name a model after '#'"),
    ("openai:http://h/v1#", "must name a model after '#'"),
    ("openai:127.0.0.1:8000/v1#m", "http(s)://"),
    ("openai:http://#m", "http(s)://"),
])
def test_parse_errors_name_spec_and_expected_forms(spec, fragment):
    with pytest.raises(BackendSpecError) as e:
        parse_spec(spec)
    assert fragment in str(e.value) and repr(spec) in str(e.value) and "openai:<http(s) base url>#<model>" in str(e.value)
    assert isinstance(e.value, ValueError)


def test_missing_dir_is_a_spec_error(tmp_path):
    with pytest.raises(BackendSpecError, match="is not a directory"):
        load_backend(f"hf:{tmp_path / 'missing'}")
    with pytest.raises(BackendSpecError, match="names a server"):
        resolve_model_path("openai:http://h/v1#m")


def test_hf_spec_with_cache(tiny_model_dir, tmp_path):
    b = load_backend(f"hf:{tiny_model_dir}", cache=ResponseCache(tmp_path / "c.sqlite"), batch_size=2)
    assert isinstance(b, CachedBackend) and isinstance(b.backend, HFBackend) and b.backend.batch_size == 2
    msgs = [[{"role": "user", "content": "hello"}]]
    first = b.generate(msgs, GenerationParams(max_new_tokens=3))
    second = b.generate(msgs, GenerationParams(max_new_tokens=3))
    assert b.calls == 1 and second[0].cached and second[0].text == first[0].text
    assert b.count_tokens("hello world") == 2


def test_openai_spec_builds_client(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    b = load_backend("openai:http://127.0.0.1:9/v1#Qwen3-32B", max_concurrency=2, batch_size=8)
    assert isinstance(b, OpenAIBackend) and b.model == "Qwen3-32B" and b.max_concurrency == 2
    assert b.client.api_key == "sk-test" and str(b.client.base_url).startswith("http://127.0.0.1:9/v1")
    monkeypatch.delenv("OPENAI_API_KEY")
    assert load_backend("openai:http://127.0.0.1:9/v1#m").client.api_key == "EMPTY"


@pytest.mark.skipif(importlib.util.find_spec("vllm") is not None, reason="vllm is installed")
def test_vllm_spec_without_vllm_says_how_to_install(tiny_model_dir):
    with pytest.raises(BackendSpecError, match=r"pip install 'memgym\[gpu\]'"):
        load_backend(f"vllm:{tiny_model_dir}", batch_size=8)


def test_model_name_typos_suggest_the_embedded_model(tmp_path, monkeypatch):
    from memgym.llm.specs import resolve_model_path
    from memgym.training.common import resolve_model_path as policy_path

    monkeypatch.chdir(tmp_path)
    with pytest.raises(BackendSpecError, match="did you mean hf:smollm2"):
        resolve_model_path("hf:smolm2")
    with pytest.raises(ConfigError, match="did you mean 'smollm2'"):
        policy_path("smolm2")
    assert policy_path("Qwen/Qwen3-4B-Instruct-2507") == "Qwen/Qwen3-4B-Instruct-2507"  # hub ids pass through
