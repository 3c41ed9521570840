"""``memgym score``: score a predictions file with a benchmark's official judge.

``memgym score --dataset locomo|longmemeval|beam [--path P] [--split S] --predictions preds.jsonl
--judge SPEC|grounded-recall|f1|answer-recall|rubric-recall [--out DIR]`` writes ``scores.json``,
``rows.jsonl`` and ``report.md`` (see :mod:`memgym.rewards.scoring.predictions`) and prints the overall
and headline numbers. Exit 0 on success; 3 when the file covers only part of the questions
(scores written, headline marked partial; ``--allow_partial`` accepts it with exit 0); 2 for a
missing, empty or broken data/predictions file, a predictions file whose ids are all unknown, or
a bad option or output folder: a file, or a folder holding anything but a previous score's files
(one line on stderr, never a traceback). Unreadable judge replies are warned about on stderr.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings

from memgym.llm.errors import say_error

#: What ``memgym score`` writes in ``--out``; a folder holding anything else is refused.
SCORE_FILES = ("scores.json", "rows.jsonl", "report.md")

JUDGE_HELP = ("the judge: a backend spec (hf:<dir>|hf:smollm2|openai:<url>#<model>|vllm:<model>) runs the "
              "dataset's official LLM judge protocol ($MEMGYM_DATA/judges: LoCoMo = MemBuilder's CORRECT/WRONG, "
              "LongMemEval per-type yes/no, BEAM rubric + Kendall tau-b event ordering); f1 = LoCoMo token F1; "
              "grounded-recall (the gold evidence held verbatim), answer-recall and rubric-recall (BEAM; "
              "word-coverage proxies) are offline proxies over the line's 'context' (else its prediction), "
              "cut to --context_tokens")
#: The context budget of the canonical offline recipes (launch/recipes/evolve_*_offline.yaml).
DEFAULT_CONTEXT_TOKENS = {"locomo": 1024, "longmemeval": 1024, "beam": 2048}
INCOMPLETE = 3


def _run(args: argparse.Namespace) -> int:
    from memgym.data_synth.errors import DataFileNotFoundError, DataFormatError, DataQuirkWarning
    from memgym.data_synth.datasets import load_conversations
    from memgym.llm.base import LLMError
    from memgym.llm.errors import ConfigError, OutputPathError
    from memgym.llm.checks import out_dir_problem
    from memgym.rewards.scoring.scorers import make_scorer
    from memgym.rewards.scoring.predictions import (CONTEXT_JUDGES, OFFLINE_JUDGES, PredictionsError, read_predictions,
                                             score_predictions, write_scores)

    def fail(msg) -> int:
        say_error("memgym score", f"error: {msg}")
        return 2

    t0 = time.time()
    if args.judge == "rubric-recall" and args.dataset != "beam":
        return fail("rubric-recall scores BEAM rubrics only; use grounded-recall, answer-recall, f1 or an LLM judge")
    if args.context_tokens is not None and args.context_tokens < 1:
        return fail(f"--context_tokens must be a positive int, got {args.context_tokens}")
    if not args.out.strip():
        return fail("--out: give an output folder (an empty path would write into the current folder)")
    try:
        problem = out_dir_problem(args.out, what="memgym score output", own=SCORE_FILES, mark=SCORE_FILES[0],
                                  writes=f"memgym score writes {', '.join(SCORE_FILES)} there")
        if problem:
            raise OutputPathError(problem)
        from memgym.rewards.scoring.judge_protocols import check_protocol
        check_protocol(args.dataset, args.judge_protocol)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", DataQuirkWarning)
            convs = load_conversations(args.dataset, args.path, split=args.split)
        for w in caught:
            print(f"warning: {w.message}", file=sys.stderr)
        preds = read_predictions(args.predictions)
        rt = None
        if args.judge in OFFLINE_JUDGES:
            scorer = make_scorer(args.judge, dataset=args.dataset, judge_protocol=args.judge_protocol)
        else:
            from memgym.llm.specs import parse_spec
            from memgym.llm.runtime import Runtime

            parse_spec(args.judge)
            rt = Runtime.from_config(cache=args.cache, batch_size=args.batch_size)
            scorer = make_scorer("llm", rt.backend(args.judge, role="judge"), dataset=args.dataset,
                                 judge_protocol=args.judge_protocol)
        known = {q.id for c in convs for q in c.questions}
        if preds and not any(q in known for q in preds):
            return fail(f"none of the {len(preds)} prediction ids of {args.predictions} is a {args.dataset} question "
                        f"id here (e.g. {next(iter(preds))!r}); `memgym data stats --ids` lists them")
        budget = None
        if args.judge in CONTEXT_JUDGES:
            from memgym.rewards.scoring.context_budget import ContextBudget
            tokens = args.context_tokens if args.context_tokens is not None else DEFAULT_CONTEXT_TOKENS[args.dataset]
            budget = ContextBudget(tokens, args.context_tokenizer)
        rep = score_predictions(args.dataset, convs, preds, scorer, judge_protocol=args.judge_protocol,
                                missing_as_wrong=args.missing_as_wrong, budget=budget)
        rep["run_card"] = _run_card(args, rt, t0, budget is not None)
        write_scores(rep, args.out, args.judge)
    except (DataFileNotFoundError, DataFormatError, PredictionsError, FileNotFoundError, ValueError, LLMError,
            ConfigError) as e:
        return fail(e)
    except OSError as e:  # the output folder cannot be made or written
        return fail(f"--out {args.out}: {e.strerror or e}")
    keys = ("overall", "task_averaged", "abstention", "by_ability", "judged", "n")
    summary = {"coverage": rep["coverage"], "judge_protocol": rep["judge_protocol"],
               **{k: rep[k] for k in keys if k in rep},
               "missing": len(rep["missing"]), "unknown": len(rep["unknown"])}
    print(json.dumps(summary, indent=2))
    if rep["missing"]:
        print(f"warning: {len(rep['missing'])} question(s) without a prediction "
              f"{'counted as wrong' if args.missing_as_wrong else 'left out of the scores (as the official metrics)'}"
              f" (e.g. {', '.join(rep['missing'][:3])})", file=sys.stderr)
    if rep["unknown"]:
        print(f"warning: {len(rep['unknown'])} prediction id(s) not in the data ignored "
              f"(e.g. {', '.join(rep['unknown'][:3])})", file=sys.stderr)
    jc = rep.get("judge_calls") or {}
    if jc.get("unreadable"):
        print(f"warning: {jc['unreadable']} of {jc['prompts']} judge replies were unreadable by the protocol's rule "
              f"(scored as it scores them, not cached; e.g. {jc['examples'][0][:80]!r}): is --judge a working "
              f"judge model?", file=sys.stderr)
    print(f"scores: {args.out}/scores.json, report: {args.out}/report.md", file=sys.stderr)
    if rep["missing"] and not args.missing_as_wrong and not args.allow_partial:
        say_error("memgym score", f"incomplete: the predictions cover {rep['coverage'].split(': ', 1)[1]}; the scores "
                                  "are over those only (--allow_partial accepts this, --missing_as_wrong counts the "
                                  "rest as wrong)")
        return INCOMPLETE
    return 0


def _run_card(args: argparse.Namespace, rt, t0: float, budget: bool) -> dict:
    """The run card of a scoring run (:func:`memgym.llm.runcard.build_card`): the arguments as its recipe,
    the judge model when ``--judge`` names one, the context budget's tokenizer when ``budget``."""
    from memgym.llm.runcard import build_card
    from memgym.rewards.scoring.predictions import OFFLINE_JUDGES
    from memgym.rewards.scoring.judge_protocols import protocol_card

    recipe = {k: v for k, v in vars(args).items() if k not in ("func", "debug", "command")}
    offline = args.judge in OFFLINE_JUDGES
    models = {"judge": None if offline else args.judge, "context_tokenizer": args.context_tokenizer if budget else None}
    return build_card(recipe=recipe, models=models, runtime=rt,
                      judge=protocol_card(args.dataset, args.judge_protocol, args.judge if offline else "llm"),
                      wall_s=round(time.time() - t0, 2))


def register(sub) -> None:
    """Add ``score`` to the ``memgym`` parser."""
    p = sub.add_parser(
        "score", help="score a predictions file with a benchmark's official judge",
        description="Score predictions made by any system, one JSON line per question "
                    '({"question_id", "prediction"[, "context"]}, or LongMemEval\'s {"question_id", "hypothesis"}; '
                    "ids as `memgym data stats --ids` lists them), with the benchmark's official judge. Writes "
                    "scores.json (judge_protocol, overall, by_category, by_capability, the dataset's official "
                    "fields, judged, missing, unknown, judge_calls), rows.jsonl (with every judge request and "
                    "reply) and report.md. A question without a prediction is listed under missing and left out "
                    "of the scores (--missing_as_wrong counts it as 0); ids not in the data are listed under "
                    "unknown; a file whose ids are all unknown is an error.")
    p.add_argument("--dataset", required=True, choices=("locomo", "longmemeval", "beam"))
    p.add_argument("--path", default=None, help="the data file or folder (default: under $MEMGYM_DATA); for BEAM a "
                                                "chat folder, a size folder or the BEAM root")
    p.add_argument("--split", default=None, help="only this split's questions (see memgym data stats --help)")
    p.add_argument("--predictions", required=True, help="JSONL predictions file")
    p.add_argument("--judge", required=True, help=JUDGE_HELP)
    p.add_argument("--judge_protocol", "--judge-protocol", default="official",
                   help="official (default: the benchmark's own judge code byte for byte, its file checked by sha256, "
                        "comparable with published numbers) | corrected (beam only: the question filled in, 0.5 kept) "
                        "| custom:<file> (another protocol file, named with its sha256 in the report)")
    p.add_argument("--missing_as_wrong", "--missing-as-wrong", action="store_true",
                   help="count questions without a prediction as wrong (default: left out, as the official "
                        "LongMemEval metrics; the report names the choice)")
    p.add_argument("--allow_partial", "--allow-partial", action="store_true",
                   help="exit 0 for a file that covers only part of the questions (default: exit 3; the headline "
                        "says 'partial: k of n questions' either way)")
    p.add_argument("--context_tokens", "--context-tokens", type=int, default=None,
                   help="offline context scorers: cut every context to this many tokens first, as an evaluation "
                        "does (default: locomo 1024, longmemeval 1024, beam 2048)")
    p.add_argument("--context_tokenizer", "--context-tokenizer", default="smollm2",
                   help="tokenizer of --context_tokens: smollm2 | hf:<dir>")
    p.add_argument("--out", default="runs/score", help="output folder (default runs/score)")
    p.add_argument("--cache", default=None, help="response cache sqlite for the LLM judge (default under "
                                                 "$MEMGYM_CACHE; 'none' disables)")
    p.add_argument("--batch_size", "--batch-size", type=int, default=8, help="hf backend generation batch (default 8)")
    p.set_defaults(func=_run)
