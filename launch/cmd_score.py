"""``memgym score``: score a predictions file with a benchmark's official judge.

``memgym score --dataset locomo|longmemeval|beam [--path P] [--split S] --predictions preds.jsonl
--judge SPEC|f1|answer-recall|rubric-recall [--out DIR]`` writes ``scores.json``, ``rows.jsonl``
and ``report.md`` (see :mod:`rewards.scoring`) and prints the overall and headline numbers.
Exit 0 on success, 2 for a missing or broken data/predictions file or a bad option (one line
on stderr, never a traceback).
"""
from __future__ import annotations

import argparse
import json
import sys
import warnings

JUDGE_HELP = ("the judge: a backend spec (hf:<dir>|hf:smollm2|openai:<url>#<model>|vllm:<model>) runs the "
              "dataset's official LLM judge (LoCoMo CORRECT/WRONG, LongMemEval per-type yes/no, BEAM rubric "
              "1/0.5/0 + Kendall tau event ordering); f1 = LoCoMo token F1; answer-recall and rubric-recall "
              "(BEAM) are offline proxies over the line's 'context' (else its prediction)")


def _run(args: argparse.Namespace) -> int:
    from data_synth.errors import DataFileNotFoundError, DataFormatError, DataQuirkWarning
    from data_synth.datasets import load_conversations
    from llm.base import LLMError
    from rewards.judge import make_scorer
    from rewards.scoring import OFFLINE_JUDGES, PredictionsError, read_predictions, score_predictions, write_scores

    def fail(msg) -> int:
        print(f"memgym score: error: {msg}", file=sys.stderr)
        return 2

    if args.judge == "rubric-recall" and args.dataset != "beam":
        return fail("rubric-recall scores BEAM rubrics only; use answer-recall, f1 or an LLM judge")
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DataQuirkWarning)
            convs = load_conversations(args.dataset, args.path, split=args.split)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        preds = read_predictions(args.predictions)
        if args.judge in OFFLINE_JUDGES:
            scorer = make_scorer(args.judge)
        else:
            from llm.specs import parse_spec
            from llm.runtime import Runtime

            parse_spec(args.judge)
            rt = Runtime.from_config(cache=args.cache, batch_size=args.batch_size)
            scorer = make_scorer("llm", rt.backend(args.judge, role="judge"), dataset=args.dataset)
        rep = score_predictions(args.dataset, convs, preds, scorer)
    except (DataFileNotFoundError, DataFormatError, PredictionsError, FileNotFoundError, ValueError, LLMError) as e:
        return fail(e)
    write_scores(rep, args.out, args.judge)
    summary = {"overall": rep["overall"], "n": rep["n"], "n_scored": rep["n_scored"],
               "missing": len(rep["missing"]), "unknown": len(rep["unknown"]),
               "headline": {k: v for k, v in rep["headline"].items() if k != "by_chat"}}
    print(json.dumps(summary, indent=2))
    if rep["missing"]:
        print(f"warning: {len(rep['missing'])} question(s) without a prediction scored 0 "
              f"(e.g. {', '.join(rep['missing'][:3])})", file=sys.stderr)
    if rep["unknown"]:
        print(f"warning: {len(rep['unknown'])} prediction id(s) not in the data ignored "
              f"(e.g. {', '.join(rep['unknown'][:3])})", file=sys.stderr)
    print(f"scores: {args.out}/scores.json, report: {args.out}/report.md", file=sys.stderr)
    return 0


def register(sub) -> None:
    """Add ``score`` to the ``memgym`` parser."""
    p = sub.add_parser(
        "score", help="score a predictions file with a benchmark's official judge",
        description="Score predictions made by any system, one JSON line per question "
                    '({"question_id", "prediction"[, "context"]}; ids as `memgym data stats --ids` lists them), '
                    "with the benchmark's official judge. Writes scores.json (overall, by_category, by_capability, "
                    "headline, missing, unknown, judge_calls), rows.jsonl and report.md. A question without a "
                    "prediction scores 0 and is listed under missing; ids not in the data are listed under unknown.")
    p.add_argument("--dataset", required=True, choices=("locomo", "longmemeval", "beam"))
    p.add_argument("--path", default=None, help="the data file or folder (default: under $MEMGYM_DATA); for BEAM a "
                                                "chat folder, a size folder or the BEAM root")
    p.add_argument("--split", default=None, help="only this split's questions (see memgym data stats --help)")
    p.add_argument("--predictions", required=True, help="JSONL predictions file")
    p.add_argument("--judge", required=True, help=JUDGE_HELP)
    p.add_argument("--out", default="runs/score", help="output folder (default runs/score)")
    p.add_argument("--cache", default=None, help="response cache sqlite for the LLM judge (default under "
                                                 "$MEMGYM_CACHE; 'none' disables)")
    p.add_argument("--batch-size", type=int, default=8, help="hf backend generation batch (default 8)")
    p.set_defaults(func=_run)
