"""ONNX Runtime execution of a sentence-transformers text encoder, exported from its packaged
weights (nothing is downloaded): the ``onnx`` and ``onnx-int8`` backends of
:class:`llm.embeddings.STEmbedder`.

Only the transformer (``SentenceTransformer[0]``'s Hugging Face model: ``input_ids``,
``attention_mask``, ``token_type_ids`` → ``last_hidden_state`` of shape (batch, seq, dim)) runs
in onnxruntime. Tokenisation (:meth:`SentenceTransformer.preprocess`, the model's own
truncation to ``max_seq_length`` word pieces), pooling and normalisation stay the
sentence-transformers modules of the loaded model (``SentenceTransformer[1:]``: for
all-MiniLM-L6-v2 mean pooling over the attention mask, then L2 normalisation), so the result
is ``SentenceTransformer.encode(texts, normalize_embeddings=True)`` with the transformer's
matrix products done by onnxruntime.

- ``onnx``: fp32. Measured on 150 BEAM-1M lines (``memgym bench embed``): max |Δ| to the torch
  vectors about 2e-7 (float rounding order), the same top-10 for every question.
- ``onnx-int8``: ``onnxruntime.quantization.quantize_dynamic`` (QInt8 weights of every MatMul,
  activations quantised per batch at run time; Jacob et al. 2018, "Quantization and Training of
  Neural Networks for Efficient Integer-Arithmetic-Only Inference"). Changes the vectors
  (cosine to fp32 0.92-0.94 on BEAM-1M lines) and so the rankings: an opt-in speed switch, never the default.

Exports are written once to ``<cache>/onnx/<name>.onnx`` (atomically: a temporary file, then
``os.replace``) and reused. Requires the ``onnx`` extra (``pip install 'memgym[onnx]'``:
onnxruntime, onnx); without it :func:`require_onnxruntime` raises ``ImportError`` saying so.
"""
from __future__ import annotations

import os
import tempfile
from pathlib import Path

import numpy as np

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def require_onnxruntime():
    """The ``onnxruntime`` module; ``ImportError`` naming the extra when it is not installed."""
    try:
        import onnxruntime
    except ImportError as e:  # pragma: no cover - depends on the environment
        raise ImportError("embedding backend onnx/onnx-int8 needs onnxruntime and onnx: "
                          "pip install 'memgym[onnx]' (or choose backend torch)") from e
    return onnxruntime


def _atomic_target(path: Path):
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    return Path(tmp)


def export_transformer(st_model, path: str | Path, attention: str | None = "eager") -> Path:
    """Export ``st_model[0]``'s Hugging Face model to ONNX at ``path`` (opset 17, dynamic batch
    and sequence axes; the TorchScript exporter, ``dynamo=False``) unless ``path`` exists.
    Returns ``path``. The inputs are those of :data:`INPUTS` that the tokenizer produces.

    ``attention``: the attention implementation traced (``model.set_attn_implementation``,
    restored afterwards; None = the model's own, ``sdpa`` for all-MiniLM-L6-v2). ``eager``
    (default) traces plain MatMul/Softmax, which onnxruntime runs faster than the traced
    ``sdpa`` graph: measured on 100 BEAM-1M-3 lines, 1 thread, batches of 8, 3.7 vs 5.2 CPU s
    (batches of 64: 5.8 vs 8.0); both within 1.9e-7 of torch."""
    import torch

    path = Path(path)
    if path.is_file():
        return path
    hf = st_model[0].model
    before = getattr(hf.config, "_attn_implementation", None)
    if attention and attention != before:
        hf.set_attn_implementation(attention)
    try:
        return _export(st_model, hf, path, torch)
    finally:
        if attention and before and attention != before:
            hf.set_attn_implementation(before)


def _export(st_model, hf, path: Path, torch) -> Path:
    names = [n for n in INPUTS if n in st_model.preprocess(["a b"])]

    class _Hidden(torch.nn.Module):
        def __init__(self, model):
            super().__init__()
            self.model = model

        def forward(self, *args):
            return self.model(**dict(zip(names, args))).last_hidden_state

    sample = st_model.preprocess(["export sample one", "two"])
    tmp = _atomic_target(path)
    was_training = hf.training
    hf.eval()
    try:
        import warnings

        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(_Hidden(hf), tuple(sample[n] for n in names), str(tmp), dynamo=False,
                              input_names=names, output_names=["last_hidden_state"], opset_version=17,
                              dynamic_axes={n: {0: "batch", 1: "seq"} for n in [*names, "last_hidden_state"]})
        os.replace(tmp, path)
    finally:
        hf.train(was_training)
        tmp.unlink(missing_ok=True)
    return path


def quantize_int8(src: str | Path, dst: str | Path) -> Path:
    """Dynamic int8 quantisation of the ONNX model ``src`` into ``dst`` (skipped when ``dst``
    exists): ``onnxruntime.quantization.quantize_dynamic`` with QInt8 weights."""
    dst = Path(dst)
    if dst.is_file():
        return dst
    require_onnxruntime()
    from onnxruntime.quantization import QuantType, quantize_dynamic

    tmp = _atomic_target(dst)
    try:
        quantize_dynamic(str(src), str(tmp), weight_type=QuantType.QInt8)
        os.replace(tmp, dst)
    finally:
        tmp.unlink(missing_ok=True)
    return dst


class OnnxEncoder:
    """``encode(texts, batch_size)`` → float32 (n, dim), rows L2-normalised, as
    ``SentenceTransformer.encode(..., normalize_embeddings=True)`` with the transformer run by
    an onnxruntime ``InferenceSession`` over ``onnx_path``.

    Texts are processed longest first (by characters, as sentence-transformers does) in
    mini-batches of ``batch_size``; ``threads`` = onnxruntime intra-op threads (default
    ``torch.get_num_threads()``, so ``OMP_NUM_THREADS`` / ``torch.set_num_threads`` apply as
    they do to the torch backend). Intra-op spinning is off: on the shared 2-core box, 2
    threads took 6.5 CPU s spinning vs 4.9 not (100 BEAM-1M-3 lines, batches of 8)."""

    def __init__(self, st_model, onnx_path: str | Path, threads: int | None = None):
        import torch

        ort = require_onnxruntime()
        self.st = st_model
        self.path = Path(onnx_path)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = int(threads or torch.get_num_threads())
        opts.inter_op_num_threads = 1
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        self.options = opts
        self.session = ort.InferenceSession(str(onnx_path), opts, providers=["CPUExecutionProvider"])
        self.names = [i.name for i in self.session.get_inputs()]

    def encode(self, texts: list[str], batch_size: int = 8) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        dim = int(self.st.get_embedding_dimension())
        out = np.zeros((len(texts), dim), dtype=np.float32)
        order = np.argsort([-len(t) for t in texts], kind="stable")
        for start in range(0, len(texts), batch_size):
            idx = order[start:start + batch_size]
            feats = self.st.preprocess([texts[i] for i in idx])
            hidden = self.session.run(None, {n: feats[n].numpy().astype(np.int64) for n in self.names})[0]
            feats["token_embeddings"] = torch.from_numpy(hidden)
            with torch.no_grad():
                for module in list(self.st)[1:]:
                    feats = module(feats)
                vec = F.normalize(feats["sentence_embedding"].float(), p=2, dim=1)
            out[idx] = vec.numpy()
        return out
