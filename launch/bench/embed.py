"""``memgym bench embed``: levers for embedding long histories (issue 20: one BEAM-1M chat of
~1,600-2,000 messages takes 135-180 s from cold caches on 2 cores, nearly all of it
all-MiniLM-L6-v2 over long messages).

First the chat itself, measured on all of its rendered lines (``[date] speaker: text``, cut to
4,000 characters, the line a ranked program embeds): lines, the share of distinct lines (what
a text-hash cache can save inside one chat), the word-piece length distribution (untruncated;
the model reads at most ``max_seq_length`` = 256) and the padding waste of length-sorted
mini-batches of 64 (the share of padded positions, which sentence-transformers' length sort
leaves).

Then the levers, side by side in one process on the first ``--n`` lines, after one warm-up call
per model, best of ``--repeats`` passes, each through :class:`llm.embeddings.STEmbedder`'s own
code path (no cache):

- ``today``: the embedder before issue 20's speed work (torch backend, batch 64, 256 word pieces,
  the process's torch threads: 1 under ``OMP_NUM_THREADS=1``), the reference of every ratio;
- ``default``: the current default, batches of :data:`llm.embeddings.DEFAULT_BATCH` (8);
- ``threads2``: the same with ``torch.set_num_threads(2)``;
- ``batch16``: mini-batches of 16;
- ``seq128``: ``max_seq_length`` 128 (the length MiniLM was trained at) instead of 256;
- ``onnx`` / ``onnx-threads2``: the ``onnx`` backend (:mod:`llm.embed_onnx`: the packaged
  weights exported once with ``torch.onnx.export``, run by onnxruntime fp32), 1 or 2 intra-op
  threads;
- ``onnx-int8``: the ``onnx-int8`` backend (dynamic int8 weights).

Also the embedding side of DESIGN.md's batched sandbox retrieval: the chat's questions embedded
one call each (today: one ``retrieve`` per question) vs in one call.

Per lever: seconds, lines per second, the speed ratio against ``today``, the seconds it
would take for the whole chat (lines / rate), the minimum and mean cosine of each vector with
the ``today`` one, and the share of the chat's questions whose top-10 lines (cosine, over the same
``--n`` lines, order included) equal ``today``'s. A lever that changes vectors changes
retrieval, so it changes scores. Nothing is downloaded: the model is the packaged weights.
"""
from __future__ import annotations

import time

EMBED_CHARS = 4000  # as memory_bank/programs/*.py: the embedder reads the first 256 word pieces only


def _lines(chat: str):
    from data_synth.beam import load_beam

    conv = load_beam(None, ids=[chat])[0]
    lines = [f"[{s.date.date().isoformat() if s.date else ''}] {t.speaker}: {t.text}"[:EMBED_CHARS]
             for s in conv.sessions for t in s.turns]
    return lines, [q.question for q in conv.questions]


def chat_stats(model, lines: list[str], batch: int = 64) -> dict:
    """Distinct share, word-piece length percentiles (untruncated, special tokens included), the
    share over the model's cap and the padding waste of length-sorted batches of ``batch``."""
    import numpy as np

    cap = int(model.max_seq_length)
    lens = np.array([len(x) for x in model.tokenizer(lines, add_special_tokens=True, truncation=False)["input_ids"]])
    used = np.sort(np.minimum(lens, cap))[::-1]
    padded = sum(int(used[i:i + batch].max()) * len(used[i:i + batch]) for i in range(0, len(used), batch))
    return {"lines": len(lines), "distinct_share": round(len(set(lines)) / max(len(lines), 1), 4),
            "mean_chars": round(float(np.mean([len(x) for x in lines])), 1),
            "wordpieces_p10_p50_p90": [int(v) for v in np.percentile(lens, [10, 50, 90])],
            "cap": cap, "share_over_cap": round(float((lens > cap).mean()), 3),
            "share_over_128": round(float((lens > 128).mean()), 3),
            "padding_waste": round(1 - float(used.sum()) / padded, 4)}


def bench_embed(chat: str = "1M-3", n: int = 150, repeats: int = 2) -> dict:
    """The measurements of the module doc as a dict ``{"chat", "n", "stats", "levers": {name: {...}}}``."""
    import warnings

    import numpy as np
    import torch

    from llm.embed_onnx import OnnxEncoder
    from llm.embeddings import DEFAULT_BATCH, STEmbedder

    lines, questions = _lines(chat)
    sub = lines[:n]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        base = STEmbedder()
        short = STEmbedder()
        short.model.max_seq_length = 128
        onnx = STEmbedder(backend="onnx")
        int8 = STEmbedder(backend="onnx-int8")
    stats = chat_stats(base.model, lines)
    onnx2 = STEmbedder.__new__(STEmbedder)
    onnx2.__dict__.update(onnx.__dict__)
    onnx2._onnx = OnnxEncoder(onnx.model, onnx._onnx.path, threads=2)
    threads0 = torch.get_num_threads()

    def run(emb, texts, bs=64, threads=None):
        before = emb.batch_size
        emb.batch_size = bs
        if threads:
            torch.set_num_threads(threads)
        try:
            return emb.encode(texts)
        finally:
            torch.set_num_threads(threads0)
            emb.batch_size = before

    levers = {"today": (base, 64, None), "default": (base, DEFAULT_BATCH, None), "threads2": (base, 64, 2),
              "batch16": (base, 16, None),
              "seq128": (short, 64, None), "onnx": (onnx, 64, None), "onnx-threads2": (onnx2, 64, None),
              "onnx-int8": (int8, 64, None)}
    for emb in (base, short, onnx, onnx2, int8):
        emb.encode(sub[:8])  # warm-up
    times = {k: [] for k in levers}
    vecs, qvecs = {}, {}
    for _ in range(repeats):
        for name, (emb, bs, th) in levers.items():
            t0 = time.perf_counter()
            vecs[name] = run(emb, sub, bs, th)
            times[name].append(time.perf_counter() - t0)
    for name, (emb, _, _) in levers.items():
        qvecs[name] = emb.encode(questions)
    # DESIGN.md's batched retrieval, the embedding side: the chat's questions one call each vs one call
    q_one, q_all = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        for q in questions:
            base.encode([q])
        q_one.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        base.encode(questions)
        q_all.append(time.perf_counter() - t0)
    queries = {"n": len(questions), "one_call_each_s": round(min(q_one), 3), "one_call_s": round(min(q_all), 3),
               "ratio": round(min(q_one) / min(q_all), 2)}

    def top10(name):
        return [tuple(np.argsort(-(vecs[name] @ q), kind="stable")[:10]) for q in qvecs[name]]

    ref_top, t_ref = top10("today"), min(times["today"])
    out = {}
    for name in levers:
        cos = (vecs[name] * vecs["today"]).sum(1)
        t = min(times[name])
        out[name] = {"s": round(t, 2), "lines_per_s": round(len(sub) / t, 2), "ratio": round(t_ref / t, 2),
                     "chat_s": round(stats["lines"] * t / len(sub), 1),
                     "min_cos": round(float(cos.min()), 6), "mean_cos": round(float(cos.mean()), 6),
                     "max_abs_diff": float(np.abs(vecs[name] - vecs["today"]).max()),
                     "top10_equal": round(sum(a == b for a, b in zip(top10(name), ref_top)) / len(ref_top), 3)}
    return {"chat": chat, "n": len(sub), "repeats": repeats, "torch_threads": threads0, "stats": stats,
            "queries": queries, "levers": out}


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
    s = r["stats"]
    print(f"BEAM {r['chat']}: {s['lines']} lines ({s['distinct_share']:.1%} distinct, {s['mean_chars']} chars on "
          f"average); word pieces p10/p50/p90 {s['wordpieces_p10_p50_p90']}, {s['share_over_cap']:.1%} over the "
          f"model's {s['cap']} ({s['share_over_128']:.1%} over 128); padding waste of sorted batches of 64: "
          f"{s['padding_waste']:.1%}")
    print(f"levers on the first {r['n']} lines, best of {r['repeats']} passes, one process, "
          f"torch threads {r['torch_threads']}")
    print("| lever | s | lines/s | speed ratio vs today | s per chat | min cos | max abs diff | equal top-10 |")
    print("|---|---|---|---|---|---|---|---|")
    for k, v in r["levers"].items():
        print(f"| {k} | {v['s']} | {v['lines_per_s']} | {v['ratio']}x | {v['chat_s']} | {v['min_cos']} | "
              f"{v['max_abs_diff']:.1e} | {v['top10_equal']} |")
    q = r["queries"]
    print(f"queries (batched retrieval, embedding side): {q['n']} questions one call each {q['one_call_each_s']} s, "
          f"in one call {q['one_call_s']} s ({q['ratio']}x)")
    print(json.dumps(r))
    return 0
