"""``memgym annotate``: LLM capability labels for a train or valid split (PrisMem's annotation).

``memgym annotate --dataset D --split train|valid --annotator SPEC --out labels.jsonl`` labels
every question of the split with :class:`memgym.data_synth.annotate.CapabilityAnnotator` (the
question, the reference answer and the evidence turns; one primary and up to two secondary
capabilities; PrisMem, arXiv 2610.06361), appending to ``--out``, the
file the evolve recipes' ``labels:`` field reads (train and valid may share one file: run the
command once per split). Resumable: labels already in ``--out`` for this annotator model are
kept and not asked again (kill -9 safe: the file is appended every ``--chunk`` questions, a torn
last line is cut). Cached: replies go through the response cache (``--cache``, default under
``$MEMGYM_CACHE``), so a rerun into a new file costs no calls. Never the test split: ``--split
test`` (or a test conversation) is refused before any call. Prints and writes
(``<out stem>.<split>.agreement.md`` / ``.json``) the agreement with the native mapping per
benchmark type (primary match rate, confusion table; :func:`memgym.data_synth.annotate.agreement`),
over the annotator's labels only. A question whose every reply fails validation keeps its native
label in memory but is not saved (nor its replies cached): the command then exits 1 naming how
many, and a rerun asks them again.
Cost: one annotator call per question (more for replies that fail validation), 64 new tokens.
Exit 2 for a bad argument, the test split, or a broken label file; 1 for a failing server or
questions left without an annotator label.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path


def _annotate(args) -> int:
    from memgym.data_synth.annotate import CapabilityAnnotator, LabelValidationError, agreement, load_labels, render_agreement
    from memgym.data_synth.datasets import load_conversations
    from memgym.data_synth.splits import split_ids
    from memgym.llm.errors import ConfigError
    from memgym.llm.runtime import Runtime

    if args.split == "test":
        raise ConfigError(f"--split test: the annotator refuses the {args.dataset} test split (test questions keep "
                          "the native mapping); use train or valid")
    ids = split_ids(args.dataset, args.split)
    convs = load_conversations(args.dataset, args.path, ids=ids, max_questions=args.max_questions)
    rt = Runtime.from_config(cache=args.cache, batch_size=args.concurrency)
    backend = rt.backend(args.annotator, role="annotator")
    ann = CapabilityAnnotator(backend, args.out, max_retries=args.max_retries, chunk=args.chunk)
    labels = ann.annotate(args.dataset, convs, args.split)
    n_q = sum(len(c.questions) for c in convs)
    a = agreement(args.dataset, convs, labels)
    tokens = {"prompt": sum(x.prompt_tokens for x in labels.values()),
              "completion": sum(x.completion_tokens for x in labels.values())}
    title = f"Agreement with the native mapping: {args.dataset} {args.split}, annotator {ann.model}"
    text = render_agreement(a, title) + (f"\n{len(labels)} labels for {n_q} questions in {args.out}; annotator calls "
                                         f"this run {rt.calls['annotator']} ({ann.calls - rt.calls['annotator']} "
                                         f"replies from the response cache); tokens of these labels {tokens['prompt']:,} prompt + "
                                         f"{tokens['completion']:,} completion (cache hits cost 0)\n")
    stem = Path(args.out).with_suffix("")
    Path(f"{stem}.{args.split}.agreement.md").write_text(text, encoding="utf-8")
    Path(f"{stem}.{args.split}.agreement.json").write_text(json.dumps(
        {**a, "dataset": args.dataset, "split": args.split, "annotator": ann.model, "labels": len(labels),
         "questions": n_q, "calls": ann.calls, "tokens": tokens}, indent=1), encoding="utf-8")
    print(text, end="")
    saved = load_labels(args.out)
    missing = [q.id for c in convs for q in c.questions if q.id not in saved]
    if missing:
        why = next((labels[q].error for q in missing if q in labels and labels[q].error), "no label")
        raise LabelValidationError(
            f"{len(missing)} of {n_q} questions got no valid annotator label (every reply failed validation, e.g. "
            f"{why}); they are not saved in {args.out} and a rerun asks them again: is --annotator a working model?")
    return 0


def register(subparsers) -> argparse.ArgumentParser:
    """Add ``memgym annotate``."""
    p = subparsers.add_parser(
        "annotate", help="LLM capability labels for a train/valid split (resumable, cached; never test)",
        description="memgym annotate --dataset locomo --split train --annotator openai:URL#MODEL --out labels.jsonl: "
                    "one primary and up to two secondary capabilities per question (PrisMem's annotation), appended "
                    "to --out (resumable); prints the agreement with the native mapping per benchmark type.")
    p.add_argument("--dataset", required=True, choices=("locomo", "longmemeval", "beam"))
    p.add_argument("--split", required=True, choices=("train", "valid", "test"),
                   help="train or valid (test is refused: test questions keep the native mapping)")
    p.add_argument("--annotator", required=True, metavar="SPEC",
                   help="annotator backend spec: openai:<url>#<model> | hf:<dir> | vllm:<dir>")
    p.add_argument("--out", required=True, metavar="labels.jsonl", help="label file (appended; the recipes' labels:)")
    p.add_argument("--path", default=None, help="data file or folder (default: the dataset's under $MEMGYM_DATA)")
    p.add_argument("--max_questions", type=int, default=None, help="questions per conversation (default: all)")
    p.add_argument("--max_retries", type=int, default=2, help="extra attempts after an invalid reply")
    p.add_argument("--chunk", type=int, default=32, help="questions per append to --out")
    p.add_argument("--concurrency", type=int, default=8, help="requests in flight / generation batch")
    p.add_argument("--cache", default=None, help="response cache sqlite (default under $MEMGYM_CACHE); 'none' disables")
    p.set_defaults(func=_annotate)
    return p
