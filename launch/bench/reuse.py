"""``memgym bench reuse``: revision-aware execution reuse on LoCoMo with the expert extractor.

Measures, in one run, the wall time and model calls of evaluating a retrieval-only revision
of the reference program (a child that changes only ``Memory.retrieve``: it returns the packed
lines in score order instead of chronological order) in two ways:

- **reuse**: with the stage cache its parent left behind (extract, index and plan outputs are
  reused; retrieve, score and the diagnostics run);
- **full**: with an empty stage cache (every stage runs).

Both measured runs start from fresh, empty embedding and response caches (the models are
loaded once, before timing), so the counts are the model work each one really needs. Their
scores must be equal (``scores_equal``): reuse changes cost, never results. Ratios are
reuse / full, measured side by side in the same process (never a timed test).
"""
from __future__ import annotations

import json
import time

CHILD_OLD = 'return "\\n".join(self.lines[i] for i in sorted(chosen))'
CHILD_NEW = 'return "\\n".join(self.lines[i] for i in chosen)'


def retrieval_only_child(parent_source: str) -> str:
    """The reference program with ``retrieve`` returning lines best-first. Raises ValueError
    if the parent lacks the expected line or the edit touches more than ``retrieval``."""
    from evolution.execution.component_diff import diff_components

    if CHILD_OLD not in parent_source:
        raise ValueError(f"parent program has no line {CHILD_OLD!r} to revise")
    child = parent_source.replace(CHILD_OLD, CHILD_NEW)
    diff = diff_components(parent_source, child)
    if diff.changed != ("retrieval",):
        raise ValueError(f"the revision must change only retrieval, changed {diff.changed}")
    return child


def bench_reuse(conversations=("conv-30",), *, n_sessions: int | None = None, plan_mode: str = "question",
                task_model: str = "hf:smollm2", embedder=None, progress: bool = False) -> dict:
    """Run parent (warm-up of the stage cache), then the child with reuse and in full.

    ``embedder``: an :class:`llm.base.Embedder` (default MiniLM, :class:`llm.embeddings.STEmbedder`;
    its ``cache`` attribute, if any, is replaced by an empty in-memory cache before each run).
    ``plan_mode``: ``question`` (default; no task LLM) or ``llm`` (planning by ``task_model``).
    Returns ``{"conversations", "sessions", "questions", "runs": {"reuse": row, "full": row},
    "ratio": {"wall", "task_calls", "embed_calls", "embed_texts"}, "scores_equal", ...}``
    where a row has ``wall_s``, ``task_calls``, ``embed_calls`` (encode calls that reached the
    model), ``embed_texts`` (distinct texts embedded; None for an embedder without a cache),
    ``stage_items``, ``overall`` and ``d_ret``.
    """
    from data_synth.locomo import load_locomo
    from data_synth.views import restrict
    from evolution.execution.program_eval import evaluate_program
    from evolution.execution.runner import ProgramRunner, RunnerSettings
    from evolution.execution.stages import StageCache
    from llm.cache import CachedBackend, ResponseCache
    from llm.embeddings import EmbeddingCache, STEmbedder
    from memory_bank.programs import read_program_source, reference_program_path
    from llm.runtime import Runtime

    convs = load_locomo(ids=list(conversations))
    if n_sessions:
        convs = [restrict(c, n_sessions) for c in convs]
    parent = read_program_source(reference_program_path())
    child = retrieval_only_child(parent)
    emb = embedder or STEmbedder()
    emb.encode(["warm-up"])
    raw_task = None
    if plan_mode == "llm":
        from llm.specs import load_backend
        raw_task = load_backend(task_model)
    settings = RunnerSettings(extractor="expert:" + ",".join(conversations), task_model=task_model,
                              plan_mode=plan_mode, scorer="answer-recall", progress=progress)

    def runtime() -> Runtime:
        if hasattr(emb, "cache"):
            emb.cache = EmbeddingCache()
        rt = Runtime(cache=None, embedder=emb)
        if raw_task is not None:
            rt.register(task_model, CachedBackend(raw_task, ResponseCache(":memory:")))
        return rt

    def measure(source, cache, parent_source=None) -> dict:
        rt = runtime()
        e0 = emb.calls
        t = time.perf_counter()
        ev, _ = evaluate_program(source, convs, ProgramRunner(rt, settings, cache), parent_source=parent_source)
        rep = ev.to_dict(tasks=False)
        wall = time.perf_counter() - t
        texts = len(emb.cache) if getattr(emb, "cache", None) is not None else None  # fresh cache: texts embedded
        return {"wall_s": round(wall, 3), "task_calls": rep["model_calls"].get("task", 0), "embed_calls": emb.calls - e0,
                "embed_texts": texts,
                "stage_items": rep["stage_items"], "stages_run": rep["stages_run"],
                "stages_reused": rep["stages_reused"], "overall": rep["overall"],
                "d_ret": rep["diagnostics"]["overall"]["d_ret"]}

    shared = StageCache()
    warm = measure(parent, shared)
    reuse = measure(child, shared, parent)
    full = measure(child, StageCache(), parent)

    def ratio(key):
        return round(reuse[key] / full[key], 4) if full[key] else None

    return {"conversations": list(conversations), "sessions": sum(len(c.sessions) for c in convs),
            "questions": sum(len(c.questions) for c in convs), "plan_mode": plan_mode,
            "embedder": getattr(emb, "model_id", "?"), "parent_wall_s": warm["wall_s"],
            "runs": {"reuse": reuse, "full": full},
            "ratio": {"wall": ratio("wall_s"), "task_calls": ratio("task_calls"), "embed_calls": ratio("embed_calls"),
                      "embed_texts": ratio("embed_texts") if full["embed_texts"] is not None else None},
            # MiniLM batches differ between the runs, so cosines agree to float precision, not bit for bit
            "scores_equal": abs(reuse["overall"] - full["overall"]) < 1e-12 and abs(reuse["d_ret"] - full["d_ret"]) < 1e-6}


def _items(row: dict, stage: str) -> str:
    c = row["stage_items"][stage]
    return f"{c['run']}/{c['reused']}"


def _reuse(args) -> int:
    res = bench_reuse(tuple(args.conversations), n_sessions=args.n_sessions, plan_mode=args.plan_mode,
                      task_model=args.task_model, progress=args.progress)
    print(f"LoCoMo {', '.join(res['conversations'])}: {res['sessions']} sessions, {res['questions']} QA, "
          f"expert extraction, plan_mode={res['plan_mode']}; child = reference with a retrieval-only revision\n")
    print("| run | wall s | task LLM calls | embed calls (texts) | extract run/reused | index run/reused | "
          "plan run/reused | retrieve run/reused | score |")
    print("|---|---|---|---|---|---|---|---|---|")
    for name in ("reuse", "full"):
        r = res["runs"][name]
        print(f"| {name} | {r['wall_s']:.2f} | {r['task_calls']} | {r['embed_calls']} ({r['embed_texts']}) | "
              f"{_items(r, 'extract')} | "
              f"{_items(r, 'index')} | {_items(r, 'plan')} | {_items(r, 'retrieve')} | {r['overall']:.3f} |")
    ra = res["ratio"]
    print(f"| **reuse / full** | {ra['wall']} | {ra['task_calls']} | {ra['embed_calls']} ({ra['embed_texts']}) | | | | | "
          f"{'equal' if res['scores_equal'] else 'DIFFERENT'} |")
    print(json.dumps(res))
    return 0 if res["scores_equal"] else 1


def register_bench(sub) -> None:
    """Add ``memgym bench reuse`` to the bench sub-parsers."""
    p = sub.add_parser("reuse", help="retrieval-only revision: stage reuse vs full re-evaluation (wall, model calls)",
                       description="On LoCoMo with the expert extractor, evaluate the reference program, then a child "
                                   "that changes only Memory.retrieve twice: reusing the parent's stage outputs and "
                                   "from scratch. Prints a table and JSON with reuse/full ratios of wall time and model "
                                   "calls; exit 1 if the two child runs disagree on the scores.")
    p.add_argument("--conversations", nargs="+", default=["conv-30"], metavar="CONV",
                   help="LoCoMo conversations with expert trajectories (conv-26, conv-30; default conv-30)")
    p.add_argument("--n-sessions", type=int, default=None, metavar="N", help="first N sessions only (default all)")
    p.add_argument("--plan-mode", choices=("question", "llm"), default="question",
                   help="question: no task LLM (default); llm: plans by --task-model")
    p.add_argument("--task-model", default="hf:smollm2", help="task LLM spec for --plan-mode llm")
    p.add_argument("--progress", action="store_true", help="show progress bars")
    p.set_defaults(func=_reuse)
