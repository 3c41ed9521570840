"""SmolLM2-135M-Instruct generation throughput on CPU: memgym's hf backend (transformers, float32)
vs vLLM's CPU build in-process (``vllm:``, ``LLM.chat``) vs served (``memgym serve --engine vllm``
read through the ``openai:`` backend), on the same prompts, greedy, at batch 1 and batch 32; the
start-up of each (model load / engine init / server ready) apart. Run in the vllm venv:

    VLLM_CPU_KVCACHE_SPACE=1 .venv-vllm/bin/python scripts/experiments/vllm_cpu/bench.py [--out DIR]

Batch 1: ``--b1`` prompts one after another; batch 32: 32 prompts in one ``generate`` call (hf:
one padded batch; in-process: one ``LLM.chat``; served: 32 requests in flight). tokens/s = the
completion tokens the backend reports / wall seconds of the calls. Every engine runs with
``--threads`` torch threads (vLLM's CPU worker takes one core and leaves one to the API process on
a 2-core box). Writes ``<out>/bench.json`` and prints the Markdown table of the README.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(REPO))
TOPICS = ["a lighthouse", "a lost key", "a rainy market", "a chess club", "a night train", "a garden", "a robot",
          "a bakery", "a mountain hut", "a river ferry", "a school play", "an old radio", "a city bus", "a kite",
          "a snowstorm", "a violin", "a library", "a fishing boat", "a bicycle race", "a museum", "a volcano",
          "a birthday", "a desert road", "a treehouse", "a harbour", "a comet", "a recipe", "a marathon",
          "a puppet show", "a clock tower", "a beehive", "a paper boat"]


def prompts() -> list[list[dict]]:
    return [[{"role": "user", "content": f"Write a short story about {t}."}] for t in TOPICS]


def timed(backend, batches, params) -> dict:
    t0, tokens = time.perf_counter(), 0
    for b in batches:
        tokens += sum(c.completion_tokens for c in backend.generate(b, params))
    wall = time.perf_counter() - t0
    return {"tokens": tokens, "wall_s": round(wall, 2), "tokens_per_s": round(tokens / wall, 1)}


def measure(backend, args, params) -> dict:
    ps = prompts()
    backend.generate(ps[:1], params)  # warm-up, not timed
    return {"batch1": timed(backend, [[p] for p in ps[: args.b1]], params), "batch32": timed(backend, [ps], params)}


def serve(model: Path, log: Path) -> tuple[subprocess.Popen, str, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "memgym.launch.cli", "serve", "--model", f"vllm:{model}", "--engine",
                             "vllm", "--port", "0", "--", "--max-model-len", "4096", "--max-num-seqs", "32"],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    ready: list = []

    def pump():
        with open(log, "w") as f:
            for line in proc.stdout:
                f.write(line)
                if line.startswith("{") and '"base_url"' in line:
                    ready.append(json.loads(line))

    threading.Thread(target=pump, daemon=True).start()
    while not ready:
        if proc.poll() is not None:
            raise SystemExit(f"memgym serve exited {proc.returncode}; see {log}")
        time.sleep(0.5)
    return proc, ready[0]["base_url"], time.perf_counter() - t0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--out", default="runs/vllm_cpu_bench")
    p.add_argument("--max-new-tokens", type=int, default=64)
    p.add_argument("--b1", type=int, default=8, help="prompts run one at a time (default 8)")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--only", nargs="+", choices=("hf", "vllm", "served", "compiled"), default=("hf", "vllm", "served"),
                   help="rows to run (compiled: vLLM in-process without enforce_eager, inductor warm-up included)")
    args = p.parse_args(argv)
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    from memgym.llm.base import GenerationParams
    from memgym.llm.models import prepare_smollm2

    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    model = prepare_smollm2()
    params = GenerationParams(max_new_tokens=args.max_new_tokens, temperature=0)
    rows = {}
    if "hf" in args.only:
        from memgym.llm.hf_backend import HFBackend

        t0 = time.perf_counter()
        hf = HFBackend(model, batch_size=32)
        rows["hf (transformers, float32)"] = {"startup_s": round(time.perf_counter() - t0, 1), **measure(hf, args, params)}
        del hf
    if "vllm" in args.only:
        from memgym.llm.vllm_backend import VLLMBackend

        t0 = time.perf_counter()
        eng = VLLMBackend(model, max_model_len=4096, max_num_seqs=32)
        rows["vLLM in-process (eager, float32)"] = {"startup_s": round(time.perf_counter() - t0, 1),
                                                    **measure(eng, args, params)}
        del eng
    if "compiled" in args.only:
        from memgym.llm.vllm_backend import VLLMBackend

        t0 = time.perf_counter()
        eng = VLLMBackend(model, max_model_len=4096, max_num_seqs=32, enforce_eager=False)
        rows["vLLM in-process (compiled, float32)"] = {"startup_s": round(time.perf_counter() - t0, 1),
                                                       **measure(eng, args, params)}
        del eng
    if "served" in args.only:
        from memgym.llm.openai_backend import OpenAIBackend

        proc, url, startup = serve(model, out / "serve.log")
        try:
            be = OpenAIBackend(url, str(model), max_concurrency=32)
            rows["vLLM served (memgym serve, openai:)"] = {"startup_s": round(startup, 1), **measure(be, args, params)}
        finally:
            proc.terminate()
            proc.wait(60)
    import vllm
    import transformers

    info = {"machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores",
            "load_average": os.getloadavg(), "torch": torch.__version__, "transformers": transformers.__version__,
            "vllm": vllm.__version__, "max_new_tokens": args.max_new_tokens, "threads": args.threads,
            "date": time.strftime("%Y-%m-%d"), "rows": rows}
    (out / "bench.json").write_text(json.dumps(info, indent=2) + "\n")
    print(f"| backend | start-up s | batch 1: tokens/s (tokens, s) | batch 32: tokens/s (tokens, s) |\n|---|---|---|---|")
    for name, r in rows.items():
        b1, b32 = r["batch1"], r["batch32"]
        print(f"| {name} | {r['startup_s']} | {b1['tokens_per_s']} ({b1['tokens']}, {b1['wall_s']}) | "
              f"{b32['tokens_per_s']} ({b32['tokens']}, {b32['wall_s']}) |")
    print(f"\nload average {info['load_average']}; {out / 'bench.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
