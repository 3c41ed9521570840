"""ResponseCache + CachedBackend."""
from __future__ import annotations

import threading

import pytest

from memgym.llm.base import Completion, GenerationParams, LLMError
from memgym.llm.cache import CachedBackend, ResponseCache, cache_key
from tests.helpers import ScriptedBackend

A = [{"role": "user", "content": "a"}]
B = [{"role": "user", "content": "b"}]
C = [{"role": "user", "content": "c"}]
GREEDY = GenerationParams(max_new_tokens=16)


def echo(messages, params):
    return f"answer to {messages[-1]['content']} t={params.temperature}"


def test_key_depends_on_model_messages_and_params():
    k = cache_key("m", A, GREEDY)
    assert k == cache_key("m", [dict(A[0])], GenerationParams(max_new_tokens=16))
    assert len(k) == 64
    assert len({k, cache_key("m2", A, GREEDY), cache_key("m", B, GREEDY),
                cache_key("m", A, GenerationParams(max_new_tokens=17)),
                cache_key("m", A, GREEDY, occurrence=1)}) == 5


def test_hits_make_no_model_call_and_are_marked_cached(tmp_path):
    inner = ScriptedBackend(echo)
    cb = CachedBackend(inner, ResponseCache(tmp_path / "r.sqlite"))
    first = cb.generate([A, B], GREEDY)
    assert [c.cached for c in first] == [False, False] and cb.calls == 2
    second = cb.generate([A, B], GREEDY)
    assert cb.calls == 2 and (cb.hits, cb.misses) == (2, 2)
    assert [c.cached for c in second] == [True, True]
    assert [c.text for c in second] == [c.text for c in first] == ["answer to a t=0.0", "answer to b t=0.0"]
    assert [(c.prompt_tokens, c.completion_tokens) for c in second] == [(1, 4), (1, 4)]


def test_misses_go_to_the_backend_in_one_call_in_order(tmp_path):
    inner = ScriptedBackend(echo)
    batches = []
    orig = inner.generate
    inner.generate = lambda batch, params: (batches.append(batch), orig(batch, params))[1]
    cb = CachedBackend(inner, ResponseCache(tmp_path / "r.sqlite"))
    cb.generate([B], GREEDY)
    out = cb.generate([A, B, C, A], GREEDY)
    assert batches == [[B], [A, C]]  # B was cached; the duplicate greedy A is generated once
    assert [c.text for c in out] == ["answer to a t=0.0", "answer to b t=0.0", "answer to c t=0.0", "answer to a t=0.0"]
    assert [c.cached for c in out] == [False, True, False, False]
    assert (cb.hits, cb.misses, cb.calls) == (1, 4, 3)


def test_persistent_across_reopen(tmp_path):
    path = tmp_path / "sub" / "r.sqlite"
    cb = CachedBackend(ScriptedBackend(echo), ResponseCache(path))
    cb.generate([A], GREEDY)
    cb.cache.close()
    fresh = ScriptedBackend(echo)
    cache = ResponseCache(path)
    assert len(cache) == 1
    out = CachedBackend(fresh, cache).generate([A], GREEDY)
    assert fresh.calls == 0 and out[0].cached and out[0].text == "answer to a t=0.0"


def test_sampled_without_seed_bypasses_cache_with_seed_is_cached(tmp_path):
    counter = {"n": 0}

    def draw(messages, params):
        counter["n"] += 1
        return f"sample {counter['n']}"

    cb = CachedBackend(ScriptedBackend(draw), ResponseCache(tmp_path / "r.sqlite"))
    hot = GenerationParams(max_new_tokens=8, temperature=0.8)
    assert [c.text for c in cb.generate([A, A], hot)] == ["sample 1", "sample 2"]
    assert [c.text for c in cb.generate([A], hot)] == ["sample 3"]
    assert cb.bypassed == 3 and len(cb.cache) == 0
    seeded = GenerationParams(max_new_tokens=8, temperature=0.8, seed=1)
    first = cb.generate([A, A], seeded)
    assert [c.text for c in first] == ["sample 4", "sample 5"]  # G copies still give G samples
    again = cb.generate([A, A], seeded)
    assert [c.text for c in again] == ["sample 4", "sample 5"] and all(c.cached for c in again)
    assert cb.calls == 5


def test_thread_safe_concurrent_use(tmp_path):
    cb = CachedBackend(ScriptedBackend(echo), ResponseCache(tmp_path / "r.sqlite"))
    prompts = [[{"role": "user", "content": str(i)}] for i in range(40)]
    errors = []

    def work(chunk):
        try:
            cb.generate(chunk, GREEDY)
        except Exception as e:  # pragma: no cover - reported below
            errors.append(e)

    threads = [threading.Thread(target=work, args=(prompts[i::4],)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and len(cb.cache) == 40


def test_backend_returning_wrong_count_is_an_error_and_nothing_is_stored(tmp_path):
    class Broken(ScriptedBackend):
        def generate(self, batch, params):
            return super().generate(batch, params)[:1]

    cb = CachedBackend(Broken(echo), ResponseCache(":memory:"))
    with pytest.raises(LLMError, match="returned 1 completions for 2 prompts"):
        cb.generate([A, B], GREEDY)
    assert len(cb.cache) == 0


def test_undecodable_row_is_a_miss(tmp_path):
    cache = ResponseCache(tmp_path / "r.sqlite")
    key = cache_key("stub", A, GREEDY)
    cache.put_many([(key, "stub", Completion("x"))])
    cache._conn.execute("UPDATE responses SET value = '{broken' WHERE key = ?", (key,))
    with pytest.warns(UserWarning, match="undecodable row"):
        assert cache.get_many([key]) == {}
    cb = CachedBackend(ScriptedBackend(echo), cache)
    with pytest.warns(UserWarning):
        assert cb.generate([A], GREEDY)[0].text == "answer to a t=0.0"
    assert cache.get_many([key])[key].text == "answer to a t=0.0"
