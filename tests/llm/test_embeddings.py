"""STEmbedder (real all-MiniLM-L6-v2 from its PyPI package), EmbeddingCache, HashEmbedder."""
from __future__ import annotations

import numpy as np
import pytest

from llm.base import Embedder
from llm.embeddings import EmbeddingCache, HashEmbedder, STEmbedder, embedding_key

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


LONG = [("word " * 600).strip(), "x" * 5000, "Caroline adopted a dog named Max. " * 20] + TEXTS


def test_onnx_backend_matches_torch_and_keys_its_own_cache(minilm, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("MEMGYM_CACHE", str(tmp_path / "cache"))
    cache = EmbeddingCache()
    e = STEmbedder(backend="onnx", cache=cache, batch_size=2)
    assert e.model_id == minilm.model_id + "+onnx"
    assert (tmp_path / "cache" / "onnx").is_dir() and len(list((tmp_path / "cache" / "onnx").glob("*.onnx"))) == 1
    ref = minilm.encode(LONG)
    got = e.encode(LONG)
    assert got.shape == (6, 384) and got.dtype == np.float32
    # the same model: texts over 256 word pieces are truncated the same way, batching/padding included
    np.testing.assert_allclose(got, ref, atol=2e-5)
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, atol=1e-5)
    # its vectors never land under the torch model's keys
    assert cache.get_many([embedding_key(minilm.model_id, LONG[0])], 384) == {}
    assert len(cache.get_many([embedding_key(e.model_id, t) for t in LONG], 384)) == 6
    # the export is reused: a second embedder loads it without exporting again
    mtime = next((tmp_path / "cache" / "onnx").glob("*.onnx")).stat().st_mtime_ns
    e2 = STEmbedder(backend="onnx")
    np.testing.assert_allclose(e2.encode(TEXTS), ref[3:], atol=2e-5)
    assert next((tmp_path / "cache" / "onnx").glob("*.onnx")).stat().st_mtime_ns == mtime


def test_onnx_int8_changes_vectors_but_keeps_meaning(minilm, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    monkeypatch.setenv("MEMGYM_CACHE", str(tmp_path / "cache"))
    e = STEmbedder(backend="onnx-int8")
    assert e.model_id == minilm.model_id + "+onnx-int8"
    v, ref = e.encode(TEXTS), minilm.encode(TEXTS)
    cos = (v * ref).sum(1)
    assert cos.min() > 0.9 and np.abs(v - ref).max() > 1e-4  # close, but not the same vectors
    assert int(np.argmax(v @ e.encode(["Who has a pet dog?"])[0])) == 0


def test_backend_switch_spec_and_environment(monkeypatch, tmp_path):
    from llm.embeddings import embed_backend, load_embedder

    monkeypatch.delenv("MEMGYM_EMBED_BACKEND", raising=False)
    assert embed_backend() == "torch"
    monkeypatch.setenv("MEMGYM_EMBED_BACKEND", "onnx-int8")
    assert embed_backend() == "onnx-int8" and embed_backend("onnx") == "onnx"
    monkeypatch.setenv("MEMGYM_EMBED_BACKEND", "tensorrt")
    with pytest.raises(ValueError, match=r"\$MEMGYM_EMBED_BACKEND.*tensorrt"):
        load_embedder("minilm")
    with pytest.raises(ValueError, match="spec suffix.*'cuda'"):
        embed_backend("cuda")
    with pytest.raises(ValueError, match="backend must be one of"):
        STEmbedder(backend="fp16")
    monkeypatch.setenv("MEMGYM_EMBED_BACKEND", "torch")
    e = load_embedder("minilm", cache=EmbeddingCache())
    assert e.backend == "torch" and not e.model_id.endswith("+onnx")
