"""STEmbedder (real all-MiniLM-L6-v2 from its PyPI package; batch size and thread settings),
EmbeddingCache, HashEmbedder, and the one embedder vocabulary of load_embedder."""
from __future__ import annotations

import numpy as np
import pytest

from memgym.llm.base import Embedder
from memgym.llm.embeddings import DEFAULT_BATCH, EmbeddingCache, HashEmbedder, STEmbedder, _env_int, embedding_key

TEXTS = ["Caroline adopted a dog named Max.", "Melanie painted a sunrise.", "The weather is nice today."]


@pytest.fixture(scope="module")
def minilm():
    return STEmbedder()


def test_shape_dtype_normalisation_and_meaning(minilm):
    assert isinstance(minilm, Embedder) and minilm.dim == 384
    v = minilm.encode(TEXTS)
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, atol=1e-5)
    q = minilm.encode(["Who has a pet dog?"])[0]
    assert int(np.argmax(v @ q)) == 0
    assert minilm.encode([]).shape == (0, 384)


def test_cache_hits_skip_the_model(minilm, tmp_path):
    e = STEmbedder(cache=EmbeddingCache(tmp_path / "emb.sqlite"))
    first = e.encode(TEXTS + [TEXTS[0]])
    assert e.calls == 1 and len(e.cache) == 3
    again = e.encode(list(reversed(TEXTS)))
    assert e.calls == 1
    np.testing.assert_array_equal(again, first[[2, 1, 0]])
    np.testing.assert_array_equal(first[0], first[3])
    # only the new text reaches the model
    e.encode([TEXTS[1], "A new sentence."])
    assert e.calls == 2 and len(e.cache) == 4
    # persistent: a fresh embedder over the same file makes no model call
    e2 = STEmbedder(cache=EmbeddingCache(tmp_path / "emb.sqlite"))
    np.testing.assert_array_equal(e2.encode(TEXTS), first[:3])
    assert e2.calls == 0
    np.testing.assert_allclose(first[:3], minilm.encode(TEXTS), atol=1e-6)


def test_cache_is_keyed_by_model_and_dim():
    cache = EmbeddingCache()
    cache.put_many({embedding_key("m", "x"): np.ones(4, dtype=np.float32)})
    assert embedding_key("m", "x") != embedding_key("m2", "x")
    assert list(cache.get_many([embedding_key("m", "x")], 4).values())[0].tolist() == [1, 1, 1, 1]
    assert cache.get_many([embedding_key("m", "x")], 8) == {}


def test_bad_input_is_a_type_error(minilm):
    with pytest.raises(TypeError, match="list of str"):
        minilm.encode("just a string")
    with pytest.raises(TypeError, match=r"texts\[1\]"):
        HashEmbedder().encode(["ok", 3])


def test_hash_embedder_is_deterministic_and_counts_tokens():
    h = HashEmbedder(dim=64)
    a = h.encode(["the cat sat", "The  cat, sat!", "", "dog"])
    b = HashEmbedder(dim=64).encode(["the cat sat"])
    assert a.shape == (4, 64) and a.dtype == np.float32 and h.calls == 1
    np.testing.assert_array_equal(a[0], b[0])
    np.testing.assert_array_equal(a[0], a[1])  # case and punctuation are ignored
    np.testing.assert_allclose(np.linalg.norm(a, axis=1), 1.0, atol=1e-6)
    # "a a b" -> counts (2, 1) in two buckets (if distinct) -> cosine with "a" is 2/sqrt(5)
    x = HashEmbedder(dim=4096)
    v = x.encode(["alpha alpha beta", "alpha"])
    assert float(v[0] @ v[1]) == pytest.approx(2 / np.sqrt(5), abs=1e-6)


def test_one_vocabulary_of_embedder_specs(tmp_path):
    from memgym.llm.embeddings import check_embedder_spec, load_embedder

    for ok in ("minilm", "none", "hash:1", "hash:256", str(tmp_path)):
        assert check_embedder_spec(ok) == ok
    assert load_embedder("none") is None
    h = load_embedder("hash:256")
    assert isinstance(h, HashEmbedder) and h.dim == 256
    e = load_embedder("minilm", cache=EmbeddingCache())
    assert isinstance(e, STEmbedder) and e.dim == 384
    for bad in ("hash", "hash:", "hash:0", "hash:x"):
        with pytest.raises(ValueError, match="hash:<dim>"):
            load_embedder(bad)
    for bad in ("", "minlm", str(tmp_path / "missing"), "minilm+onnx"):
        with pytest.raises(ValueError, match="is not one of: minilm .* hash:<dim> .* none"):
            check_embedder_spec(bad)


# lengths from 2 to 256+ word pieces, so that batches of 1, 3 and 64 pad differently
SPEED_TEXTS = ["Caroline adopted a dog named Max.", "ok", ("word " * 600).strip(),
               "Melanie painted a sunrise over the lake last summer. " * 6, "The weather is nice today.",
               "x" * 5000, "Who has a pet dog?"]


def test_batch_and_thread_defaults_and_environment(monkeypatch, minilm):
    monkeypatch.delenv("MEMGYM_EMBED_BATCH", raising=False)
    monkeypatch.delenv("MEMGYM_EMBED_THREADS", raising=False)
    assert DEFAULT_BATCH == 8 and minilm.batch_size == 8 and minilm.threads is None
    assert _env_int("MEMGYM_EMBED_BATCH", 8) == 8
    monkeypatch.setenv("MEMGYM_EMBED_BATCH", "64")
    monkeypatch.setenv("MEMGYM_EMBED_THREADS", "1")
    e = STEmbedder()
    assert e.batch_size == 64 and e.threads == 1
    assert STEmbedder(batch_size=3, threads=2).batch_size == 3  # arguments win over the environment
    for bad in ("0", "eight", "-2"):
        monkeypatch.setenv("MEMGYM_EMBED_BATCH", bad)
        with pytest.raises(ValueError, match=rf"\$MEMGYM_EMBED_BATCH must be an integer >= 1, got '{bad}'"):
            STEmbedder()
    monkeypatch.delenv("MEMGYM_EMBED_BATCH")
    with pytest.raises(ValueError, match="threads must be >= 1, got 0"):
        STEmbedder(threads=0)


def test_batch_size_changes_vectors_only_by_rounding(minilm):
    ref = STEmbedder(batch_size=64, cache=EmbeddingCache()).encode(SPEED_TEXTS)  # sentence-transformers' batch (before)
    for bs in (1, 3, 8):
        got = STEmbedder(batch_size=bs, cache=EmbeddingCache()).encode(SPEED_TEXTS)
        assert got.shape == (7, 384)
        np.testing.assert_allclose(got, ref, atol=1e-6)
        # the same ranking of every text against every other one
        assert (np.argsort(-(got @ got.T), axis=1) == np.argsort(-(ref @ ref.T), axis=1)).all()


def test_threads_are_set_for_the_call_and_restored(minilm):
    import torch

    before = torch.get_num_threads()
    seen = []
    e = STEmbedder(threads=1, cache=EmbeddingCache())
    inner = e.model.encode

    def spy(*a, **k):
        seen.append(torch.get_num_threads())
        return inner(*a, **k)

    e.model.encode = spy
    v = e.encode(SPEED_TEXTS[:2])
    assert seen == [1] and torch.get_num_threads() == before
    np.testing.assert_allclose(v, minilm.encode(SPEED_TEXTS[:2]), atol=1e-6)
