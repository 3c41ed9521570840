"""``memgym bench reward``: offline session-reward throughput, batched vs one-by-one in the
same run, and the model calls of a warm-cache re-run (must be 0).

The batch is 64 completions for conv-30's expert trajectory (a third the expert's own output,
a third the shuffled control, a third the empty control, so the gate and the banks vary).
Each cold run starts from a fresh embedding cache and response cache and a fresh
:class:`~rewards.session_reward.SessionReward`, with the model already loaded and warmed up,
so the ratio measures batching, not loading.
"""
from __future__ import annotations

import json
import sys
import time


def _completions(samples):
    from rewards.audit import control_outputs

    shuffled, empty = control_outputs(samples, "shuffled"), control_outputs(samples, "empty")
    return [s.expert_outputs[s.manager] if i % 3 == 0 else shuffled[i] if i % 3 == 1 else empty[i]
            for i, s in enumerate(samples)]


def bench_reward(trajectories, *, n: int = 64, judge: str = "answer-recall", answer_spec: str | None = None,
                 tokenizer: str = "smollm2", embedder=None, mode: str = "counterfactual") -> dict:
    """Time the reward of ``n`` completions batched (one call) and one by one (``n`` calls),
    then re-run the batched call on warm caches. Returns a dict with ``completions``,
    ``sessions`` (distinct sessions in the batch), ``batched_s``, ``one_by_one_s``,
    ``batched_per_s`` and ``one_by_one_per_s`` (completions scored per second), ``speedup``
    (one_by_one_s / batched_s), ``warm_s``, ``warm_model_calls`` ({"embed", "llm"}) and
    ``rewards_equal`` (batched and one-by-one rewards agree). Raises ValueError when the
    trajectories give fewer than ``n`` samples.
    """
    from launch.cmd_reward import load_policy_tokenizer
    from llm.cache import CachedBackend, ResponseCache
    from llm.embeddings import EmbeddingCache, STEmbedder
    from rewards.samples import build_reward_samples
    from rewards.session_reward import SessionReward, SessionRewardConfig

    emb = embedder or STEmbedder()
    emb.encode(["warm-up"])  # first-call overheads do not belong to either side
    samples = build_reward_samples(trajectories)
    if len(samples) < n:
        raise ValueError(f"{trajectories} gives {len(samples)} samples, fewer than the {n} asked for")
    comps = _completions(samples)[:n]  # controls drawn from the whole file, then cut
    samples = samples[:n]
    tok = load_policy_tokenizer(tokenizer)
    inner = None
    if judge != "answer-recall":
        from llm.specs import load_backend

        inner = load_backend(answer_spec or "hf:smollm2")

    def fresh():
        if hasattr(emb, "cache"):
            emb.cache = EmbeddingCache()
        backend = CachedBackend(inner, ResponseCache(":memory:")) if inner is not None else None
        return SessionReward(SessionRewardConfig(mode=mode, judge=judge), embedder=emb, tokenizer=tok,
                             answer_backend=backend, judge_backend=backend)

    single = fresh()
    t = time.perf_counter()
    one = [single([s], [c])[0].reward for s, c in zip(samples, comps)]
    t_single = time.perf_counter() - t
    batched = fresh()
    t = time.perf_counter()
    many = [b.reward for b in batched(samples, comps)]
    t_batched = time.perf_counter() - t
    e0, l0 = emb.calls, (inner.calls if inner is not None else 0)
    t = time.perf_counter()
    batched(samples, comps)
    t_warm = time.perf_counter() - t
    warm_calls = {"embed": emb.calls - e0, "llm": (inner.calls if inner is not None else 0) - l0}
    return {"completions": n, "sessions": len({(s.conversation_id, s.session) for s in samples}), "judge": judge,
            "mode": mode, "batched_s": round(t_batched, 3), "one_by_one_s": round(t_single, 3),
            "batched_per_s": round(n / t_batched, 2), "one_by_one_per_s": round(n / t_single, 2),
            "speedup": round(t_single / t_batched, 2), "warm_s": round(t_warm, 3), "warm_model_calls": warm_calls,
            "rewards_equal": all(abs(a - b) < 1e-9 for a, b in zip(one, many))}


def _run(args) -> int:
    from data_synth.paths import expert_dir

    traj = args.trajectories or str(expert_dir() / "conv-30.jsonl")
    try:
        r = bench_reward(traj, n=args.n, judge=args.judge, answer_spec=args.answer_model, tokenizer=args.tokenizer,
                         mode=args.mode)
    except (ValueError, FileNotFoundError) as e:
        print(f"memgym bench reward: {e}", file=sys.stderr)
        return 2
    print(f"| {r['completions']} completions ({r['sessions']} sessions), judge {r['judge']}, MiniLM | seconds | "
          "completions/s |")
    print("|---|---|---|")
    print(f"| one by one | {r['one_by_one_s']:.2f} | {r['one_by_one_per_s']:.1f} |")
    print(f"| batched | {r['batched_s']:.2f} | {r['batched_per_s']:.1f} |")
    print(f"| warm-cache re-run | {r['warm_s']:.2f} | model calls: {r['warm_model_calls']} |")
    print(f"batched / one-by-one speedup: {r['speedup']:.2f}x; rewards equal: {r['rewards_equal']}")
    print(json.dumps(r))
    return 0


def register_bench(s) -> None:
    """Add ``reward`` to the ``memgym bench`` subcommands."""
    p = s.add_parser("reward", help="session-reward throughput: batched vs one-by-one, warm-cache model calls",
                     description="Scores 64 completions of conv-30 (expert, shuffled and empty outputs) with the "
                                 "answer-recall judge and MiniLM, batched and one by one, and re-runs the batch on warm "
                                 "caches. Prints a table and JSON with the speedup and the warm re-run's model calls "
                                 "(0 expected).")
    p.add_argument("--trajectories", help="expert trajectory file (default: $MEMGYM_DATA/expert/conv-30.jsonl)")
    from launch.bench.args import int_range

    p.add_argument("--n", type=int_range(1, 100_000), default=64, help="completions in the batch (default 64)")
    p.add_argument("--judge", choices=["answer-recall", "f1", "llm"], default="answer-recall")
    p.add_argument("--answer-model", default=None, help="answer/judge model for f1/llm (default hf:smollm2)")
    p.add_argument("--mode", choices=["counterfactual", "isolated"], default="counterfactual")
    p.add_argument("--tokenizer", default="smollm2", help="policy tokenizer: smollm2 or a local model dir")
    p.set_defaults(func=_run)
