"""The cold-chat experiment: one BEAM chat evaluated end to end from cold caches, the embedder's
old settings (``today`` arm) against the current ones, side by side in one run (goal: at most
60 s cold per BEAM-1M chat of ~2,000 turns and 20 questions, retrieval unchanged).

Each arm is one ``memgym program eval PROGRAM --dataset beam --conversations CHAT --extractor turns
--scorer rubric-recall --plan_mode question --no_diagnostics`` (the offline BEAM test run of
``launch/recipes/evolve_beam_offline.yaml``) in a subprocess with a fresh ``$MEMGYM_CACHE`` (an
empty embedding cache and stage cache), then once more over the same cache (warm). The arms
differ only in environment variables:

- ``today``: ``MEMGYM_EMBED_BATCH=64``, no thread setting and ``OMP_WAIT_POLICY`` set empty (so
  the CLI leaves the OpenMP runtime's own wait policy): sentence-transformers' batch of 64, the
  process's torch threads, spinning OpenMP threads;
- ``default``: the current defaults (batches of :data:`memgym.llm.embeddings.DEFAULT_BATCH`);
- further arms from ``--arm NAME=VAR=VALUE[,VAR=VALUE]`` (e.g. ``t1=MEMGYM_EMBED_THREADS=1``).

Arms run alternately, ``--repeats`` times each. Per run: wall seconds, CPU seconds (user + system
of the subprocess tree, ``resource.getrusage(RUSAGE_CHILDREN)``: the figure a shared, loaded box
distorts least), the 1-minute load average before and after, the overall score, and whether the
retrieved texts (the ``retrieve`` rows of the run's stage cache, as a sorted list) equal the first
run's. Ratios are against ``today``.
"""
from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TODAY = {"MEMGYM_EMBED_BATCH": "64", "MEMGYM_EMBED_THREADS": None, "OMP_WAIT_POLICY": ""}
DEFAULT = {"MEMGYM_EMBED_BATCH": None, "MEMGYM_EMBED_THREADS": None}


def parse_arm(text: str) -> tuple[str, dict]:
    """``NAME=VAR=VALUE[,VAR=VALUE...]`` → (NAME, {VAR: VALUE}); ``ValueError`` names a bad part."""
    name, sep, rest = text.partition("=")
    if not name or not sep or not rest:
        raise ValueError(f"--arm {text!r}: expected NAME=VAR=VALUE[,VAR=VALUE]")
    env = {}
    for part in rest.split(","):
        var, eq, value = part.partition("=")
        if not var or not eq:
            raise ValueError(f"--arm {text!r}: {part!r} is not VAR=VALUE")
        env[var] = value
    return name, env


def _children_cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _load() -> float:
    return os.getloadavg()[0]


def run_once(program: str, chat: str, env_over: dict, cache: str, out: str) -> dict:
    """One ``program eval`` subprocess; its wall and CPU seconds, load before/after, overall and
    the retrieved text per question."""
    env = dict(os.environ, MEMGYM_CACHE=cache)
    for k, v in env_over.items():
        if v is None:
            env.pop(k, None)
        else:
            env[k] = v
    cmd = [sys.executable, "-m", "memgym.launch.cli", "program", "eval", program, "--dataset", "beam", "--conversations", chat,
           "--extractor", "turns", "--scorer", "rubric-recall", "--plan_mode", "question", "--no_diagnostics",
           "--no_progress", "--out", out]
    l0, c0, t0 = _load(), _children_cpu(), time.perf_counter()
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True)
    wall, cpu = time.perf_counter() - t0, _children_cpu() - c0
    if proc.returncode != 0:
        raise RuntimeError(f"program eval failed (exit {proc.returncode}): {proc.stderr[-1500:]}")
    report = json.loads((Path(out) / "report.json").read_text())
    import sqlite3

    with sqlite3.connect(Path(cache) / "stages.sqlite") as db:  # the retrieved texts, as the stage cache keeps them
        texts = sorted(bytes(v) for (v,) in db.execute("SELECT value FROM stages WHERE stage = 'retrieve'"))
    return {"wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "load": [round(l0, 2), round(_load(), 2)],
            "overall": report["overall"], "texts": texts}


def bench_coldchat(program: str, chat: str, arms: dict[str, dict], repeats: int = 1, warm: bool = True) -> dict:
    """``{"chat", "program", "runs": [{arm, phase, wall_s, cpu_s, load, overall, same_retrieval}]}``."""
    runs, first_texts = [], None
    with tempfile.TemporaryDirectory(prefix="memgym-coldchat-") as tmp:
        for rep in range(repeats):
            for name, env in arms.items():
                cache = tempfile.mkdtemp(prefix=f"{name}-{rep}-cache-", dir=tmp)
                for phase in ("cold", "warm") if warm else ("cold",):
                    r = run_once(program, chat, env, cache, os.path.join(tmp, f"{name}-{rep}-{phase}"))
                    texts = r.pop("texts")
                    first_texts = texts if first_texts is None else first_texts
                    runs.append({"arm": name, "phase": phase, **r, "same_retrieval": texts == first_texts})
    return {"chat": chat, "program": program, "arms": {k: {a: b for a, b in v.items()} for k, v in arms.items()},
            "runs": runs}


def summary_rows(result: dict) -> list[dict]:
    """Per (arm, phase): best wall and CPU over the repeats, and their ratios against ``today``'s."""
    best: dict[tuple, dict] = {}
    for r in result["runs"]:
        key = (r["arm"], r["phase"])
        b = best.setdefault(key, {"arm": r["arm"], "phase": r["phase"], "wall_s": r["wall_s"], "cpu_s": r["cpu_s"],
                                  "overall": r["overall"], "same_retrieval": r["same_retrieval"]})
        b["wall_s"], b["cpu_s"] = min(b["wall_s"], r["wall_s"]), min(b["cpu_s"], r["cpu_s"])
        b["same_retrieval"] = b["same_retrieval"] and r["same_retrieval"]
    rows = list(best.values())
    for row in rows:
        ref = best.get(("today", row["phase"]))
        row["wall_ratio"] = round(ref["wall_s"] / row["wall_s"], 2) if ref else None
        row["cpu_ratio"] = round(ref["cpu_s"] / row["cpu_s"], 2) if ref else None
    return rows


def _run(args) -> int:
    arms = {"today": TODAY, "default": DEFAULT}
    for text in args.arm:
        name, env = parse_arm(text)
        arms[name] = env
    r = bench_coldchat(args.program, args.chat, arms, args.repeats, warm=not args.no_warm)
    print(f"BEAM {r['chat']}, {r['program']}, offline (turns, rubric-recall, question as query), fresh $MEMGYM_CACHE "
          f"per arm; {os.cpu_count()} CPUs")
    print("| arm | phase | wall s | CPU s | wall ratio vs today | CPU ratio vs today | overall | same retrieval |")
    print("|---|---|---|---|---|---|---|---|")
    for row in summary_rows(r):
        print(f"| {row['arm']} | {row['phase']} | {row['wall_s']} | {row['cpu_s']} | {row['wall_ratio']}x | "
              f"{row['cpu_ratio']}x | {row['overall']:.4f} | {row['same_retrieval']} |")
    print("runs (load average before..after):", "; ".join(f"{x['arm']} {x['phase']} {x['wall_s']} s "
                                                          f"(load {x['load'][0]}..{x['load'][1]})" for x in r["runs"]))
    print(json.dumps(r))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    p = argparse.ArgumentParser(prog="cold-chat", description=__doc__.split("\n\n")[0])
    p.add_argument("--chat", default="1M-3", help="BEAM chat id (default 1M-3)")
    p.add_argument("--program", default="memory_bank/programs/dense_topk.py", help="a ranked program (default dense_topk)")
    p.add_argument("--repeats", type=int, default=1, help="runs per arm, alternating (default 1)")
    p.add_argument("--arm", action="append", default=[], metavar="NAME=VAR=VALUE[,VAR=VALUE]",
                   help="an extra arm: environment variables over the current defaults (repeatable)")
    p.add_argument("--no_warm", action="store_true", help="skip the warm rerun of each arm")
    return _run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
