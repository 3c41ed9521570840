"""The embedder's speed settings (issue 20 item 5): batch size, threads, the eager ONNX export.
Real all-MiniLM-L6-v2 from its PyPI package; nothing is downloaded."""
from __future__ import annotations

import collections

import numpy as np
import pytest

from llm.embeddings import DEFAULT_BATCH, EmbeddingCache, STEmbedder, _env_int

# lengths from 2 to 256+ word pieces, so that batches of 1, 3 and 64 pad differently
TEXTS = ["Caroline adopted a dog named Max.", "ok", ("word " * 600).strip(),
         "Melanie painted a sunrise over the lake last summer. " * 6, "The weather is nice today.",
         "x" * 5000, "Who has a pet dog?"]


@pytest.fixture(scope="module")
def minilm():
    return STEmbedder()


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
    ref = STEmbedder(batch_size=64, cache=EmbeddingCache()).encode(TEXTS)  # sentence-transformers' batch (before)
    for bs in (1, 3, 8):
        got = STEmbedder(batch_size=bs, cache=EmbeddingCache()).encode(TEXTS)
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
    v = e.encode(TEXTS[:2])
    assert seen == [1] and torch.get_num_threads() == before
    np.testing.assert_allclose(v, minilm.encode(TEXTS[:2]), atol=1e-6)


def test_onnx_export_traces_eager_attention_and_matches_torch(minilm, tmp_path, monkeypatch):
    pytest.importorskip("onnxruntime")
    import onnx

    monkeypatch.setenv("MEMGYM_CACHE", str(tmp_path / "cache"))
    e = STEmbedder(backend="onnx", cache=EmbeddingCache(), threads=1)
    (path,) = list((tmp_path / "cache" / "onnx").glob("*.onnx"))
    assert path.name.endswith("-eager.onnx") and e._onnx.path == path
    ops = collections.Counter(n.op_type for n in onnx.load(str(path)).graph.node)
    # eager attention: one Softmax per layer (6), none of the NaN guards the sdpa trace adds (6 IsNaN, 13 Where)
    assert ops["Softmax"] == 6 and ops["IsNaN"] == 0 and ops["Where"] == 2 and ops["MatMul"] == 48
    # the torch model keeps its own attention after the export
    assert e.model[0].auto_model.config._attn_implementation == "sdpa"
    assert e._onnx.options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    assert e._onnx.options.intra_op_num_threads == 1
    np.testing.assert_allclose(e.encode(TEXTS), minilm.encode(TEXTS), atol=2e-6)
