"""The constrained-decoding experiment: tokens/s of schema-constrained vs free generation on SmolLM2.

Same model, same prompts (the four manager prompts of LoCoMo conv-30 session 4 over the expert
bank after session 3), same number of decoding steps, greedy; the two variants run in interleaved
rounds and each keeps its median round, so load from other processes hits both alike. See
:func:`bench_constrained` for how prefill and the one-time setup are kept out of the ratio.
Prints a table and one JSON line.
"""
from __future__ import annotations

import json
import time


def _prompts(n_sessions_before: int = 3):
    from memgym.data_synth.locomo import load_locomo
    from memgym.data_synth.paths import expert_dir
    from memgym.data_synth.expert import replay
    from memgym.memory_bank.actions import MANAGERS
    from memgym.memory_bank.prompts import build_prompt

    conv = load_locomo(None, ids=["conv-30"])[0]
    bank = replay(expert_dir() / "conv-30.jsonl", upto_session=n_sessions_before)
    session = conv.sessions[n_sessions_before]
    return [build_prompt(m, bank, session) for m in MANAGERS]


def bench_constrained(max_new_tokens: int = 128, rounds: int = 3, batch_size: int = 4, spec: str = "hf:smollm2",
                      progress: bool = True) -> dict:
    """Decoding speed, free vs constrained, on the same prompts and the same number of steps.

    A batch of the four prompts is generated for ``max_new_tokens`` steps; each call of one
    variant is paired with a 1-token call of the same variant, whose time (the prefill of the
    long prompts plus one step) is subtracted, so what is compared is the time of the same
    ``steps - 1`` decoding steps of the same batch (a batch decodes until its longest row stops;
    rows that stopped early still cost their step). tokens/s = rows x decoded steps / seconds.
    Median of ``rounds`` interleaved rounds; ``slowdown`` = constrained / free seconds per step
    (1.0 = no overhead). ``first_call_setup_s``: the first constrained call's extra time over a
    free one (wrapping the tokenizer for llguidance and compiling the four grammars).
    ``grammar_share_of_constrained_time``: the share of a constrained call's wall time spent in
    the grammar's logits processor (:attr:`memgym.llm.hf_backend.HFBackend.grammar_seconds`), measured
    inside the same steps, so machine load scales both alike; ``slowdown_from_grammar_time`` =
    1 / (1 - share). On a shared machine, prefer it over ``slowdown``."""
    from tqdm.auto import tqdm

    from memgym.llm.base import GenerationParams
    from memgym.llm.specs import load_backend
    from memgym.memory_bank.action_schemas import prompt_schema

    backend = load_backend(spec, batch_size=batch_size)
    prompts = _prompts()
    batch = [p.messages for p in prompts]
    schemas = [prompt_schema(p) for p in prompts]
    one, full = GenerationParams(max_new_tokens=1), GenerationParams(max_new_tokens=max_new_tokens)

    def timed(params, sch):
        t = time.perf_counter()
        comps = backend.generate(batch, params) if sch is None else backend.generate(batch, params, schemas=sch)
        return time.perf_counter() - t, comps

    t_free1, _ = timed(one, None)  # warm-up
    t_free1, _ = timed(one, None)
    t_con1, _ = timed(one, schemas)
    setup_s = t_con1 - t_free1
    per_step = {"free": [], "constrained": []}
    grammar_share = []
    steps = {}
    tokens = {}
    for _ in tqdm(range(rounds), desc="bench constrained", disable=not progress):
        for name, sch in (("free", None), ("constrained", schemas)):
            t1, _ = timed(one, sch)
            g0 = backend.grammar_seconds
            tn, comps = timed(full, sch)
            if sch is not None:  # the constraint's own time, measured inside the same steps
                grammar_share.append((backend.grammar_seconds - g0) / tn)
            n = max(c.completion_tokens for c in comps)
            steps[name], tokens[name] = n, sum(c.completion_tokens for c in comps)
            per_step[name].append((tn - t1) / max(1, n - 1))
    med = {k: sorted(v)[len(v) // 2] for k, v in per_step.items()}
    rows = len(batch)
    return {"model": spec, "prompts": rows, "batch_size": batch_size, "max_new_tokens": max_new_tokens,
            "rounds": rounds, "steps_free": steps["free"], "steps_constrained": steps["constrained"],
            "tokens_free": tokens["free"], "tokens_constrained": tokens["constrained"],
            "free_tok_s": round(rows / med["free"], 2), "constrained_tok_s": round(rows / med["constrained"], 2),
            "ms_per_step_free": round(1e3 * med["free"], 1), "ms_per_step_constrained": round(1e3 * med["constrained"], 1),
            "slowdown": round(med["constrained"] / med["free"], 3), "first_call_setup_s": round(setup_s, 2),
            "grammar_share_of_constrained_time": round(sorted(grammar_share)[len(grammar_share) // 2], 4),
            "slowdown_from_grammar_time": round(1 / (1 - sorted(grammar_share)[len(grammar_share) // 2]), 3)}


def _run(args) -> int:
    r = bench_constrained(args.max_new_tokens, args.rounds, args.batch_size, args.model)
    print("| variant | decoded steps x rows | ms/step | decode tokens/s |\n|---|---|---|---|")
    print(f"| free | {r['steps_free']} x {r['prompts']} | {r['ms_per_step_free']:.1f} | {r['free_tok_s']:.1f} |")
    print(f"| constrained (llguidance) | {r['steps_constrained']} x {r['prompts']} | "
          f"{r['ms_per_step_constrained']:.1f} | {r['constrained_tok_s']:.1f} |")
    if r["slowdown"] <= 0 or r["first_call_setup_s"] < 0:
        print("\nwall-time ratio unusable: the machine's load changed between the paired calls (a 1-token call "
              "took longer than a full one); rerun on an idle machine or read the grammar share below")
    print(f"\nconstrained takes {r['slowdown']:.2f}x the time per decoding step of free (median of {r['rounds']} "
          f"rounds, prefill subtracted); one-time setup {r['first_call_setup_s']:.1f} s")
    print(f"time inside the grammar mask (measured within the same steps, robust to machine load): "
          f"{100 * r['grammar_share_of_constrained_time']:.2f}% of the constrained call, i.e. "
          f"{r['slowdown_from_grammar_time']:.3f}x")
    print(json.dumps(r))
    return 0


def main(argv: list[str] | None = None) -> int:
    import argparse

    from memgym.llm.checks import at_least

    p = argparse.ArgumentParser(prog="constrained-decoding", description=__doc__.split("\n\n")[0])
    p.add_argument("--max-new-tokens", type=at_least(1), default=128, help="tokens per output (default 128)")
    p.add_argument("--rounds", type=at_least(1), default=3, help="interleaved rounds (default 3)")
    p.add_argument("--batch-size", type=at_least(1), default=4, help="outputs per generate call (default 4)")
    p.add_argument("--model", default="hf:smollm2", help="hf backend spec (default the embedded SmolLM2)")
    return _run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
