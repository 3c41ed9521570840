"""Calibrate offline scorers: agreement with answered F1 and adversarial programs.

    python scripts/experiments/offline_scorer/calibrate.py --ctx /tmp/ctx
reads the dumps of dump_contexts.py.
"""
from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from pathlib import Path

from scipy.stats import pearsonr, spearmanr

from memgym.data_synth.datasets import load_conversations
from memgym.rewards.scoring.context_budget import ContextBudget
from memgym.rewards.scoring.beam_judge import rubric_recall
from memgym.rewards.scoring.grounded import grounded_parts, source_index
from memgym.rewards.scoring.metrics import answer_recall

PROGRAMS = ["seed", "bm25", "hybrid_rrf", "demo_evolve_frozen"]


def load(path):
    return [json.loads(l) for l in open(path)]


def scorers(k, cap):
    def grounded(row, conv):
        p = grounded_parts(row["retrieved"], source_index(conv, k), row["evidence"], gold=row["gold"],
                           rubric=row.get("rubric") or (), cap=cap)
        return p.score

    def recall(row, conv):
        if row.get("rubric"):
            return rubric_recall(row["rubric"], row["retrieved"])
        return answer_recall(row["gold"], row["retrieved"])
    return {"grounded": grounded, "recall": recall}


def adversaries(rows, convs, budget, seed=0):
    """name -> {qid: context} for the attack programs of one split."""
    rng = random.Random(seed)
    by_id = {c.id: c for c in convs}
    out = {n: {} for n in ("freq_words", "alpha_words", "random_words", "bm25_dedup", "bm25_shuffled",
                           "bm25_dedup_abst", "all_answers", "evidence_shuffled", "evidence_verbatim")}
    words_of = {}
    for c in convs:
        cnt = Counter(w for s in c.sessions for t in s.turns for w in re.findall(r"[A-Za-z0-9']+", t.text.lower()))
        freq = [w for w, _ in cnt.most_common()]
        rnd = freq[:]
        rng.shuffle(rnd)
        words_of[c.id] = (budget.cut(" ".join(freq)), budget.cut(" ".join(sorted(freq))), budget.cut(" ".join(rnd)))
    answers = budget.cut(" ; ".join(str(r["gold"]) for r in rows))
    for r in rows:
        c = by_id[r["conversation"]]
        f, a, rn = words_of[c.id]
        out["freq_words"][r["id"]] = f
        out["alpha_words"][r["id"]] = a
        out["random_words"][r["id"]] = rn
        words = re.findall(r"[A-Za-z0-9']+", r["bm25"].lower())
        dedup = list(dict.fromkeys(words))
        out["bm25_dedup"][r["id"]] = budget.cut(" ".join(dedup))
        out["bm25_dedup_abst"][r["id"]] = budget.cut("not mentioned in the conversation " + " ".join(dedup))
        sh = words[:]
        rng.shuffle(sh)
        out["bm25_shuffled"][r["id"]] = budget.cut(" ".join(sh))
        out["all_answers"][r["id"]] = answers
        index = c.turn_index
        ev = [index[e][1] for e in r["evidence"] if e in index]
        verb = "\n".join(f"{t.speaker}: {t.text}" + (f" [image: {t.image_caption}]" if t.image_caption else "") for t in ev)
        out["evidence_verbatim"][r["id"]] = budget.cut(verb)
        ws = verb.split()
        rng.shuffle(ws)
        out["evidence_shuffled"][r["id"]] = budget.cut(" ".join(ws))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ctx", required=True)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--cap", type=int, default=32)
    args = ap.parse_args()
    ctx = Path(args.ctx)
    sc = scorers(args.k, args.cap)
    # 1. agreement with answering: the strong LLM's answers (the shipped file) and SmolLM2's
    answered = {(r["program"], r["id"]): r for r in load("../shared/data/answered/locomo_answered.jsonl")}
    convs = {c.id: c for c in load_conversations("locomo", ids=["conv-43", "conv-44", "conv-47"])}
    refs = {"strong LLM": lambda p, r: answered[(p, r["id"])]["f1"]}
    small = {p: {r["id"]: r["score"] for r in load(ctx / f"locomo_answered_{p}_smollm2.jsonl")}
             for p in PROGRAMS if (ctx / f"locomo_answered_{p}_smollm2.jsonl").exists()}
    if len(small) == len(PROGRAMS):
        refs["SmolLM2"] = lambda p, r: small[p][r["id"]]
    for ref, get in refs.items():
        xs = {n: [] for n in sc}
        ys = []
        per_prog = {}
        for p in PROGRAMS:
            for r in load(ctx / f"locomo_answered_{p}.jsonl"):
                y = get(p, r)
                ys.append(y)
                per_prog.setdefault(p, {"f1": []})["f1"].append(y)
                for n, fn in sc.items():
                    v = fn(r, convs[r["conversation"]])
                    xs[n].append(v)
                    per_prog[p].setdefault(n, []).append(v)
        print(f"answered by {ref}: {len(ys)} (program, question) pairs")
        for n in sc:
            print(f"  {n:10s} pearson {pearsonr(xs[n], ys)[0]:.3f} spearman {spearmanr(xs[n], ys)[0]:.3f}")
        print("  program            " + "  ".join(f"{n:>9s}" for n in ["f1", *sc]))
        for p in PROGRAMS:
            print(f"  {p:18s} " + "  ".join(f"{sum(v) / len(v):9.3f}" for v in per_prog[p].values()))
    # 2. adversaries
    for dataset, split in (("locomo", "valid"), ("locomo", "test"), ("beam", "valid")):
        f = ctx / f"{dataset}_{split}_bm25.jsonl"
        if not f.exists():
            continue
        budget = ContextBudget(2048 if dataset == "beam" else 1024)
        progs = {p: load(ctx / f"{dataset}_{split}_{p}.jsonl") for p in PROGRAMS
                 if (ctx / f"{dataset}_{split}_{p}.jsonl").exists()}
        rows = progs["bm25"]
        cv = {c.id: c for c in load_conversations(dataset, ids=sorted({r["conversation"] for r in rows}))}
        for r in rows:
            r["bm25"] = r["retrieved"]
        adv = adversaries(rows, list(cv.values()), budget)
        print(f"{dataset} {split}: {len(rows)} questions")
        table = {p: [{**r} for r in rs] for p, rs in progs.items()}
        for name, m in adv.items():
            table[name] = [{**r, "retrieved": m[r["id"]]} for r in rows]
        for name, rs in table.items():
            vals = {}
            for n, fn in sc.items():  # NaN (no gold evidence) is left out, as the summaries do
                xs_ = [v for v in (fn(r, cv[r["conversation"]]) for r in rs) if v == v]
                vals[n] = sum(xs_) / len(xs_)
            print(f"  {name:20s} " + "  ".join(f"{n} {v:.3f}" for n, v in vals.items()), flush=True)


if __name__ == "__main__":
    main()
