"""Evolution benchmarks (scripts printing ratios measured side by side, never timed tests).

- ``memgym bench cases``: compact vs full diagnostic cases on real traces (LoCoMo, turns
  extraction; the seed program and the reference program): total size in tokens of a
  tokenizer (``--tokenizer``: a HF tokenizer dir, e.g. the coder's; default SmolLM2's,
  offline) and characters, the ratio compact/full, and the share of evidence snippets whose
  best-matching unit survived compaction (must be 100%). PrisMem reports -43.8% on BEAM.
- ``memgym bench round``: the cost of one evolution round (proposal → validation →
  evaluation on train and valid) with the parent's stage outputs reused vs from an empty stage
  cache, for the offline ``params`` proposer and a scripted coder: wall seconds, model calls
  (embedding batches that reached the model, task-LLM calls, coder calls) and stage items.
  The reuse run keeps the stage and embedding caches its parent's evaluation left; the full
  run starts from empty ones. Both re-run the parent on train for the compact cases (its
  index is then shared with a child that leaves indexing alone).
"""
from __future__ import annotations

import json
import shutil
import tempfile
import time
from pathlib import Path

RET_EDIT = ("Halve the number of ranked lines.\n<<<<<<< SEARCH\n        ranked = order[:TOP_K]\n=======\n"
            "        ranked = order[: max(1, TOP_K // 2)]\n>>>>>>> REPLACE\n")


def _tokenizer(spec: str | None):
    from transformers import AutoTokenizer

    if spec:
        return AutoTokenizer.from_pretrained(spec)
    from llm.models import prepare_smollm2_tokenizer
    return AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))


def bench_cases(conversations=("conv-26", "conv-30"), *, max_cases: int = 60, tokenizer: str | None = None,
                progress: bool = False) -> dict:
    """Build the cases of every failed task (score ≤ 0.8, at most ``max_cases`` per program)
    of the seed and the reference program, full and compact; returns sizes and ratios."""
    from data_synth.locomo import load_locomo
    from evolution.execution.program_eval import evaluate_program
    from evolution.execution.runner import ProgramRunner, RunnerSettings
    from evolution.execution.stages import StageCache
    from memory_bank.program import unit_text
    from evolution.search.cases import case_from_run, render_compact, render_full
    from memory_bank.programs import read_program_source, reference_program_path, seed_program_path
    from llm.runtime import Runtime

    tok = _tokenizer(tokenizer)
    convs = load_locomo(ids=list(conversations))
    rt = Runtime(cache=None)
    runner = ProgramRunner(rt, RunnerSettings(extractor="turns", plan_mode="question", diagnostics=False,
                                              progress=progress), StageCache())
    rows = {}
    for name, path in (("seed", seed_program_path()), ("reference", reference_program_path())):
        src = read_program_source(path)
        _, run = evaluate_program(src, convs, runner, diagnostics=False)
        traces = {tr.conversation.id: tr for tr in run.traces}
        failed = [t for t in run.tasks if t.score <= 0.8 and t.qa.evidence][:max_cases]
        full_tok = comp_tok = full_ch = comp_ch = n_ev = kept = 0
        for t in failed:
            mat = case_from_run(t, traces[t.conversation], lambda u: unit_text(u, run.info.unit_fields))
            full = render_full(mat)
            comp, st = render_compact(mat, rt.embedder)
            full_tok += len(tok(full)["input_ids"])
            comp_tok += len(tok(comp)["input_ids"])
            full_ch += len(full)
            comp_ch += len(comp)
            n_ev += sum(1 for ev in mat.evidence if ev.units)
            kept += st["best_unit_kept"]
        rows[name] = {"cases": len(failed), "full_tokens": full_tok, "compact_tokens": comp_tok,
                      "full_chars": full_ch, "compact_chars": comp_ch,
                      "token_ratio": round(comp_tok / full_tok, 4) if full_tok else None,
                      "evidence": n_ev, "best_unit_kept": kept,
                      "evidence_survival": round(kept / n_ev, 4) if n_ev else 1.0}
    tot_f = sum(r["full_tokens"] for r in rows.values())
    tot_c = sum(r["compact_tokens"] for r in rows.values())
    return {"conversations": list(conversations), "tokenizer": tokenizer or "SmolLM2-135M-Instruct", "programs": rows,
            "token_ratio": round(tot_c / tot_f, 4), "reduction_pct": round(100 * (1 - tot_c / tot_f), 1),
            "evidence_survival": round(sum(r["best_unit_kept"] for r in rows.values())
                                       / max(1, sum(r["evidence"] for r in rows.values())), 4)}


def bench_round(*, train=("conv-26",), valid=("conv-30",), max_questions: int | None = 40,
                plan_mode: str = "question", progress: bool = False) -> dict:
    """One round per proposer (params restricted to the retrieval-only ``mmr`` variant; a
    scripted coder with a retrieval-only edit) on a parent = seed + ``dense_ranking``, with
    and without the parent's stage outputs. Returns rows and reuse/full ratios."""
    from evolution.search.config import EvolveConfig
    from evolution.search.api import build_engine
    from evolution.search.proposers.library import variant
    from evolution.search.proposers.params import ParamsProposer
    from evolution.search.proposers.scripted import ScriptedProposer
    from llm.embeddings import EmbeddingCache, STEmbedder
    from memory_bank.programs import read_program_source, seed_program_path
    from llm.runtime import Runtime

    emb = STEmbedder()
    emb.encode(["warm-up"])
    tmp = Path(tempfile.mkdtemp(prefix="memgym-bench-round-"))
    parent = tmp / "parent.py"
    parent.write_text(variant("dense_ranking").apply(read_program_source(seed_program_path()))[0])
    proposers = {"params": lambda: ParamsProposer(library=(variant("mmr"),)),
                 "scripted coder": lambda: ScriptedProposer([RET_EDIT])}
    out = {}
    try:
        for name, make in proposers.items():
            rows = {}
            for mode in ("reuse", "full"):
                emb.cache = EmbeddingCache()
                rt = Runtime(cache=None, embedder=emb)
                d = tmp / f"{name.replace(' ', '_')}-{mode}"
                cfg = EvolveConfig(train=list(train), valid=list(valid), max_questions=max_questions, extractor="turns",
                                   plan_mode=plan_mode, scorer="answer-recall", rounds_cold=1, rounds_refine=0,
                                   rounds_integrate=0, seed_program=str(parent), progress=progress, out=str(d))
                evo = build_engine(cfg, rt=rt, proposer=make())
                evo.start()  # the parent, evaluated: warms the stage cache
                evo.state.save()
                if mode == "full":  # same archive, empty stage and embedding caches
                    evo.evaluator.cache.close()
                    (d / "stages.sqlite").unlink()
                    for extra in ("stages.sqlite-wal", "stages.sqlite-shm"):
                        if (d / extra).exists():
                            (d / extra).unlink()
                    emb.cache = EmbeddingCache()
                    rt = Runtime(cache=None, embedder=emb)
                    evo = build_engine(cfg, rt=rt, proposer=make())
                    evo.state.load()
                e0, c0 = emb.calls, rt.calls_snapshot()
                t = time.perf_counter()
                evo.run_round(1)
                wall = time.perf_counter() - t
                cand = evo.state.archive.get("r01")
                calls = rt.calls_since(c0)["calls"]
                items = next((r.stage_items for r in evo.state.journal if r.kind == "evaluation"), {})
                rows[mode] = {"wall_s": round(wall, 3), "embed_calls": emb.calls - e0,
                              "task_calls": calls.get("task", 0), "coder_calls": evo.state.ledger.totals().get(
                                  "coder", {}).get("calls", 0), "status": cand.status, "changed": cand.changed,
                              "valid_overall": cand.valid.overall if cand.valid else None,
                              "index_run": sum(v["index"]["run"] for v in items.values()) if items else None}
            r, f = rows["reuse"], rows["full"]
            out[name] = {"runs": rows, "ratio_wall": round(r["wall_s"] / f["wall_s"], 4),
                         "ratio_embed_calls": round(r["embed_calls"] / f["embed_calls"], 4) if f["embed_calls"] else None,
                         "scores_equal": r["valid_overall"] is not None and
                         abs(r["valid_overall"] - f["valid_overall"]) < 1e-9}
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return {"train": list(train), "valid": list(valid), "max_questions": max_questions, "plan_mode": plan_mode,
            "proposers": out}


def _cases(args) -> int:
    res = bench_cases(tuple(args.conversations), max_cases=args.max_cases, tokenizer=args.tokenizer,
                      progress=args.progress)
    print(f"LoCoMo {', '.join(res['conversations'])}, turns extraction, failed tasks (score <= 0.8); tokens of "
          f"{res['tokenizer']}\n")
    print("| program | cases | full tokens | compact tokens | compact/full | evidence best unit kept |")
    print("|---|---|---|---|---|---|")
    for name, r in res["programs"].items():
        print(f"| {name} | {r['cases']} | {r['full_tokens']:,} | {r['compact_tokens']:,} | {r['token_ratio']} | "
              f"{r['best_unit_kept']}/{r['evidence']} |")
    print(f"| **all** | | | | **{res['token_ratio']}** ({-res['reduction_pct']:+.1f}%) | "
          f"{100 * res['evidence_survival']:.1f}% |")
    print(json.dumps(res))
    return 0 if res["evidence_survival"] == 1.0 else 1


def _round(args) -> int:
    res = bench_round(train=tuple(args.train), valid=tuple(args.valid), max_questions=args.max_questions,
                      plan_mode=args.plan_mode, progress=args.progress)
    print(f"One round on LoCoMo train {', '.join(res['train'])} / valid {', '.join(res['valid'])} (max "
          f"{res['max_questions']} QA each), parent = seed + dense_ranking, retrieval-only child\n")
    print("| proposer | run | wall s | embed calls | task calls | coder calls | index sessions run | valid score |")
    print("|---|---|---|---|---|---|---|---|")
    for name, p in res["proposers"].items():
        for mode, r in p["runs"].items():
            print(f"| {name} | {mode} | {r['wall_s']:.2f} | {r['embed_calls']} | {r['task_calls']} | "
                  f"{r['coder_calls']} | {r['index_run']} | {r['valid_overall']} |")
        print(f"| {name} | **reuse/full** | {p['ratio_wall']} | {p['ratio_embed_calls']} | | | | "
              f"{'equal' if p['scores_equal'] else 'DIFFERENT'} |")
    print(json.dumps(res))
    return 0 if all(p["scores_equal"] for p in res["proposers"].values()) else 1


def register_bench(sub) -> None:
    """Add ``memgym bench cases`` and ``memgym bench round``."""
    c = sub.add_parser("cases", help="compact vs full diagnostic cases: token ratio and evidence survival",
                       description="On LoCoMo traces (turns extraction; seed and reference programs), render every "
                                   "failed task's diagnostic case in full and compact form; print the token ratio "
                                   "and the share of evidence whose best-matching unit survived (exit 1 if < 100%).")
    from launch.bench.args import int_range, locomo_conversation

    c.add_argument("--conversations", nargs="+", default=["conv-26", "conv-30"], metavar="CONV",
                   type=locomo_conversation)
    c.add_argument("--max-cases", type=int_range(1, 100_000), default=60, help="cases per program (default 60)")
    c.add_argument("--tokenizer", default=None, help="HF tokenizer dir (default: SmolLM2's, offline)")
    c.add_argument("--progress", action="store_true")
    c.set_defaults(func=_cases)
    r = sub.add_parser("round", help="cost of one evolution round with stage reuse vs without",
                       description="Parent = seed + dense ranking; one round of the params proposer (mmr variant) "
                                   "and of a scripted coder (retrieval-only edit), each with the parent's stage "
                                   "outputs and from an empty stage cache. Prints wall time, model calls and the "
                                   "ratios; exit 1 if the two runs score differently.")
    r.add_argument("--train", nargs="+", default=["conv-26"], metavar="CONV", type=locomo_conversation)
    r.add_argument("--valid", nargs="+", default=["conv-30"], metavar="CONV", type=locomo_conversation)
    r.add_argument("--max-questions", type=int_range(1, 100_000), default=40, help="QA per conversation (default 40)")
    r.add_argument("--plan-mode", choices=("question", "llm"), default="question")
    r.add_argument("--progress", action="store_true")
    r.set_defaults(func=_round)
