"""Dump the cut retrieved text of memory programs on LoCoMo / BEAM questions (offline: `turns`
extraction, the question as the query), for calibrating offline scorers.

    python scripts/experiments/offline_scorer/dump_contexts.py --out /tmp/ctx
writes <out>/<dataset>_<split>_<program>.jsonl: {id, conversation, question, gold, category,
capability, evidence, rubric, score, prediction, retrieved} (score: grounded-recall; with
``--answer``: SmolLM2's answer and its official F1, into ``..._smollm2.jsonl``).
``locomo:answered`` = the 140 questions of $MEMGYM_DATA/answered/locomo_answered.jsonl.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from memgym.evolution.execution.runner import ProgramRunner
from memgym.evolution.execution.settings import RunnerSettings
from memgym.evolution.execution.stage_cache import StageCache
from memgym.llm.runtime import Runtime
from memgym.data_synth.datasets import load_conversations

SPLITS = {
    ("locomo", "answered"): None,
    ("locomo", "valid"): ["conv-41", "conv-42"],
    ("locomo", "test"): ["conv-43", "conv-44", "conv-47", "conv-48", "conv-49", "conv-50"],
    ("beam", "valid"): [f"100K-{i}" for i in range(11, 17)],
}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--programs", nargs="+", default=["memory_bank/programs/seed.py", "memory_bank/programs/bm25.py",
                                                      "memory_bank/programs/hybrid_rrf.py",
                                                      "../shared/data/answered/demo_evolve_frozen.py"])
    ap.add_argument("--which", nargs="+", default=["locomo:answered", "locomo:valid", "locomo:test", "beam:valid"])
    ap.add_argument("--answer", action="store_true",
                    help="answer each question with SmolLM2 (hf:smollm2, the program's ANSWER_INSTRUCTION) and score "
                         "it with LoCoMo's official F1 instead of an offline scorer")
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rt = Runtime()
    cache = StageCache(str(out / "stages.sqlite"))
    for which in args.which:
        dataset, split = which.split(":")
        budget = 2048 if dataset == "beam" else 1024
        scorer = "f1" if args.answer else "grounded-recall"
        settings = RunnerSettings(extractor="turns", plan_mode="question", scorer=scorer, task_model="hf:smollm2",
                                  context_tokens=budget, diagnostics=False, progress=False, dataset=dataset)
        runner = ProgramRunner(rt, settings, cache)
        if split == "answered":
            rows = [json.loads(l) for l in open("../shared/data/answered/locomo_answered.jsonl")]
            want = {r["id"] for r in rows}
            convs = load_conversations("locomo", ids=["conv-43", "conv-44", "conv-47"])
            from dataclasses import replace
            convs = [replace(c, questions=tuple(q for q in c.questions if q.id in want)) for c in convs]
        else:
            convs = load_conversations(dataset, ids=SPLITS[(dataset, split)])
        for prog in args.programs:
            name = Path(prog).stem
            run = runner.run(Path(prog).read_text(), convs)
            suffix = "_smollm2" if args.answer else ""
            with open(out / f"{dataset}_{split}_{name}{suffix}.jsonl", "w") as fh:
                for t in run.tasks:
                    fh.write(json.dumps({"id": t.qa.id, "conversation": t.conversation, "question": t.qa.question,
                                         "gold": t.qa.answer, "category": t.qa.category,
                                         "capability": t.qa.capability.value if t.qa.capability else None,
                                         "evidence": list(t.qa.evidence), "rubric": list(t.qa.rubric),
                                         "score": t.score, "prediction": t.prediction,
                                         "retrieved": t.retrieved}) + "\n")
            print(which, name, len(run.tasks), round(sum(t.score for t in run.tasks) / max(1, len(run.tasks)), 4),
                  flush=True)


if __name__ == "__main__":
    main()
