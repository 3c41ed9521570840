"""The sandbox-cost experiment: what the kernel confinement (Landlock + seccomp + reaper, see
:mod:`memgym.evolution.execution.confine`) costs, per sandbox start and per evaluation, against the
Python-checks-only sandbox of before, side by side in one run.

Starts: ``--starts`` starts of the seed program (start + load + close), alternating confined
and unconfined so machine noise hits both alike; the median of each. Evaluations:
``--rounds`` alternating runs of ``memgym program eval``'s pipeline (reference program,
conv-26's first ``--sessions`` sessions, ``turns`` extraction, question plans, answer-recall,
a hash embedder, no stage cache, no diagnostics: every stage runs, no model is loaded); the
median of each and whether the scores agree. The unconfined side is the benchmark's own
baseline (``confinement="off"``), never a mode a user can pick.
"""
from __future__ import annotations

import json
import statistics
import sys
import time
from contextlib import contextmanager


@contextmanager
def _confinement(mode: str):
    """Make every sandbox started inside use ``mode`` ("auto" or "off")."""
    from memgym.evolution.execution import confine

    import warnings

    real = confine.resolve
    confine.resolve = lambda confinement="auto": real(mode)
    try:
        with warnings.catch_warnings():  # the baseline's "not confined" warning is expected here
            warnings.simplefilter("ignore", UserWarning)
            yield
    finally:
        confine.resolve = real


def bench_starts(n: int) -> dict:
    """Median wall seconds of ``n`` confined and ``n`` unconfined starts (start + load + close)."""
    from memgym.evolution.execution.sandbox import SandboxedProgram
    from memgym.memory_bank.programs import read_program_source, seed_program_path

    src = read_program_source(seed_program_path())
    times = {"auto": [], "off": []}
    label = ""
    for i in range(2 * n):
        mode = ("auto", "off")[i % 2]
        t = time.perf_counter()
        with SandboxedProgram(src, confinement=mode) as sb:
            if mode == "auto":
                label = sb.confinement
        times[mode].append(time.perf_counter() - t)
    conf, off = statistics.median(times["auto"]), statistics.median(times["off"])
    return {"starts": n, "confinement": label, "confined_s": round(conf, 4), "unconfined_s": round(off, 4),
            "ratio": round(conf / off, 3), "extra_ms": round(1000 * (conf - off), 1)}


def bench_evals(rounds: int, sessions: int) -> dict:
    """Median wall seconds of ``rounds`` confined and unconfined evaluations (see the module doc)."""
    from memgym.data_synth.datasets import load_conversations
    from memgym.evolution.execution.runner import ProgramRunner, RunnerSettings, evaluate_program
    from memgym.evolution.execution.stage_cache import StageCache
    from memgym.llm.embeddings import HashEmbedder
    from memgym.llm.runtime import Runtime
    from memgym.memory_bank.programs import read_program_source, reference_program_path

    conv = load_conversations("locomo", ids=["conv-26"], n_sessions=sessions)[0]
    src = read_program_source(reference_program_path())
    times, scores, sandboxes = {"auto": [], "off": []}, {"auto": set(), "off": set()}, 0
    for i in range(2 * rounds):
        mode = ("auto", "off")[i % 2]
        runner = ProgramRunner(Runtime(embedder=HashEmbedder(dim=256)),
                               RunnerSettings(extractor="turns", plan_mode="question", scorer="answer-recall",
                                              diagnostics=False, progress=False), StageCache())
        with _confinement(mode):
            t = time.perf_counter()
            ev, run = evaluate_program(src, [conv], runner, diagnostics=False)
            times[mode].append(time.perf_counter() - t)
        scores[mode].add(round(ev.overall, 6))
        sandboxes = len(run.traces)
    conf, off = statistics.median(times["auto"]), statistics.median(times["off"])
    return {"rounds": rounds, "sessions": sessions, "questions": ev.n, "confined_s": round(conf, 3),
            "unconfined_s": round(off, 3), "ratio": round(conf / off, 3),
            "scores_equal": scores["auto"] == scores["off"] and len(scores["auto"]) == 1,
            "overall": sorted(scores["auto"])[0], "conversations": sandboxes}


def _run(args) -> int:
    from memgym.evolution.execution import confine

    ks = confine.probe()
    if ks.landlock_abi < 1:
        print(f"sandbox-cost: nothing to compare: {ks.reason}", file=sys.stderr)
        return 2
    try:
        s = bench_starts(args.starts)
        e = bench_evals(args.rounds, args.sessions)
    except (ValueError, FileNotFoundError) as err:
        print(f"sandbox-cost: {err}", file=sys.stderr)
        return 2
    print(f"confinement: {s['confinement']}")
    print("| what | confined s | unconfined s | ratio |")
    print("|---|---|---|---|")
    print(f"| sandbox start + load + close (median of {s['starts']}) | {s['confined_s']:.4f} | "
          f"{s['unconfined_s']:.4f} | {s['ratio']:.3f} |")
    print(f"| evaluation: reference program, conv-26 {e['sessions']} sessions, {e['questions']} questions (median of "
          f"{e['rounds']}) | {e['confined_s']:.3f} | {e['unconfined_s']:.3f} | {e['ratio']:.3f} |")
    print(f"extra per start: {s['extra_ms']:.1f} ms; scores equal: {e['scores_equal']} (overall {e['overall']})")
    print(json.dumps({"starts": s, "evaluations": e}))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    from memgym.llm.checks import at_least

    p = argparse.ArgumentParser(prog="sandbox-cost", description=__doc__.split("\n\n")[0])
    p.add_argument("--starts", type=at_least(1), default=20, help="starts per side (default 20)")
    p.add_argument("--rounds", type=at_least(1), default=3, help="evaluations per side (default 3)")
    p.add_argument("--sessions", type=at_least(1), default=3, help="conv-26 sessions per evaluation (default 3)")
    return _run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
