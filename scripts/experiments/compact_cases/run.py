"""The compact-cases experiment: compact vs full diagnostic cases on real traces (LoCoMo,
turns extraction; the seed program and the reference program): total size in tokens of a
tokenizer (``--tokenizer``: a HF tokenizer dir, e.g. the coder's; default SmolLM2's, offline) and
characters, the ratio compact/full, and the share of evidence snippets whose best-matching unit
survived compaction (must be 100%; exit 1 otherwise). PrisMem reports -43.8% on BEAM."""
from __future__ import annotations

import json

def _tokenizer(spec: str | None):
    from transformers import AutoTokenizer

    if spec:
        return AutoTokenizer.from_pretrained(spec)
    from memgym.llm.models import prepare_smollm2_tokenizer
    return AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))


def bench_cases(conversations=("conv-26", "conv-30"), *, max_cases: int = 60, tokenizer: str | None = None,
                progress: bool = False) -> dict:
    """Build the cases of every failed task (score ≤ 0.8, at most ``max_cases`` per program)
    of the seed and the reference program, full and compact; returns sizes and ratios."""
    from memgym.data_synth.locomo import load_locomo
    from memgym.evolution.execution.runner import ProgramRunner, RunnerSettings, evaluate_program
    from memgym.evolution.execution.stage_cache import StageCache
    from memgym.memory_bank.contract import unit_text
    from memgym.evolution.search.cases import case_from_run, render_compact, render_full
    from memgym.memory_bank.programs import read_program_source, reference_program_path, seed_program_path
    from memgym.llm.runtime import Runtime

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


def main(argv: list[str] | None = None) -> int:
    import argparse

    from memgym.llm.checks import at_least

    p = argparse.ArgumentParser(prog="compact-cases", description=__doc__.split("\n\n")[0])
    p.add_argument("--conversations", nargs="+", default=["conv-26", "conv-30"], metavar="CONV",
                   help="LoCoMo sample ids (default conv-26 conv-30)")
    p.add_argument("--max-cases", type=at_least(1), default=60, help="cases per program (default 60)")
    p.add_argument("--tokenizer", default=None, help="HF tokenizer dir (default: SmolLM2's, offline)")
    p.add_argument("--progress", action="store_true")
    return _cases(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
