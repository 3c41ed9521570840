"""``memgym bench embed``: levers for embedding long histories (issue 20: one BEAM-1M chat takes
170-180 s from cold caches on 2 cores, nearly all of it all-MiniLM-L6-v2 over long messages).

Measured side by side in one process on the first ``--n`` rendered lines (``[date] speaker:
text``, the line a ranked program embeds) of one BEAM chat, after one warm-up call per model,
best of ``--repeats`` passes:

- ``default``: :class:`llm.embeddings.STEmbedder`'s settings (batch 64, 256 word pieces);
- ``batch16`` / ``batch8``: smaller mini-batches (sentence-transformers sorts texts by length,
  so padding is already small);
- ``seq128``: ``max_seq_length`` 128 (the length MiniLM was trained at) instead of 256;
- ``cut4000``: each text cut to 4,000 characters before tokenisation (the model reads only the
  first 256 word pieces; tokenising a 348,853-character message costs time);
- ``int8``: ``torch.ao.quantization.quantize_dynamic`` of every ``nn.Linear`` to qint8.

Per lever: seconds, the speed ratio against ``default``, the minimum and mean cosine of each
vector with the default one, and the share of the chat's questions whose top-10 lines (cosine,
over the same ``--n`` lines) equal the default's. A lever that changes vectors changes
retrieval, so it changes scores. Nothing is downloaded: the model is the packaged weights.
"""
from __future__ import annotations

import time


def _lines(chat: str):
    from data_synth.beam import load_beam

    conv = load_beam(None, ids=[chat])[0]
    lines = [f"[{s.date.date().isoformat() if s.date else ''}] {t.speaker}: {t.text}"
             for s in conv.sessions for t in s.turns]
    return lines, [q.question for q in conv.questions]


def bench_embed(chat: str = "1M-3", n: int = 150, repeats: int = 2) -> dict:
    """The measurements of the module doc as a dict ``{"chat", "n", "levers": {name: {...}}}``."""
    import os
    import warnings

    import numpy as np
    import torch
    from sentence_transformers import SentenceTransformer

    from llm.models import minilm_dir

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    lines, questions = _lines(chat)
    sub = lines[:n]

    def load():
        return SentenceTransformer(str(minilm_dir()), device="cpu", local_files_only=True)

    base = load()
    short = load()
    short.max_seq_length = 128
    quant = load()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        quant[0].model = torch.ao.quantization.quantize_dynamic(quant[0].model, {torch.nn.Linear}, dtype=torch.qint8)
    levers = {"default": (base, 64, sub), "batch16": (base, 16, sub), "batch8": (base, 8, sub),
              "seq128": (short, 64, sub), "cut4000": (base, 64, [x[:4000] for x in sub]), "int8": (quant, 64, sub)}
    for model in (base, short, quant):
        model.encode(sub[:8])  # warm-up
    times = {k: [] for k in levers}
    vecs, qvecs = {}, {}
    for _ in range(repeats):
        for name, (model, bs, texts) in levers.items():
            t0 = time.perf_counter()
            vecs[name] = model.encode(texts, batch_size=bs, convert_to_numpy=True, normalize_embeddings=True)
            times[name].append(time.perf_counter() - t0)
    for name, (model, _, _) in levers.items():
        qvecs[name] = model.encode(questions, convert_to_numpy=True, normalize_embeddings=True)

    def top10(name):
        return [tuple(np.argsort(-(vecs[name] @ q), kind="stable")[:10]) for q in qvecs[name]]

    ref_top, t_ref = top10("default"), min(times["default"])
    out = {}
    for name in levers:
        cos = (vecs[name] * vecs["default"]).sum(1)
        out[name] = {"s": round(min(times[name]), 2), "ratio": round(t_ref / min(times[name]), 2),
                     "min_cos": round(float(cos.min()), 4), "mean_cos": round(float(cos.mean()), 5),
                     "top10_equal": round(sum(a == b for a, b in zip(top10(name), ref_top)) / len(ref_top), 3)}
    return {"chat": chat, "n": len(sub), "repeats": repeats, "levers": out}


def register_bench(sub) -> None:
    p = sub.add_parser("embed", help="embedding levers on long BEAM messages: speed ratio and vector/top-10 change",
                       description=__doc__.split("\n\n")[0])
    p.add_argument("--chat", default="1M-3", help="BEAM chat id (default 1M-3)")
    p.add_argument("--n", type=int, default=150, help="first N lines of the chat (default 150)")
    p.add_argument("--repeats", type=int, default=2, help="passes per lever; the best is kept (default 2)")
    p.set_defaults(func=_run)


def _run(args) -> int:
    import json

    r = bench_embed(args.chat, args.n, args.repeats)
    print(f"BEAM {r['chat']}: {r['n']} lines, best of {r['repeats']} passes, one process")
    print("| lever | s | speed ratio vs default | min cos | mean cos | questions with equal top-10 |")
    print("|---|---|---|---|---|---|")
    for k, v in r["levers"].items():
        print(f"| {k} | {v['s']} | {v['ratio']}x | {v['min_cos']} | {v['mean_cos']} | {v['top10_equal']} |")
    print(json.dumps(r))
    return 0
