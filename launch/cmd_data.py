"""``memgym data ...``: inspect the benchmark files (LoCoMo, LongMemEval)."""
from __future__ import annotations

import argparse
import json
import sys
import warnings

from data_synth.errors import DataFileNotFoundError, DataFormatError, DataQuirkWarning
from data_synth.datasets import DATASETS, load_conversations
from data_synth.stats import dataset_stats


def _stats(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataQuirkWarning)
        try:
            convs = load_conversations(args.dataset, args.path, split=args.split,
                                       splits_path=args.splits_path)
        except (DataFileNotFoundError, DataFormatError, ValueError) as e:
            print(f"memgym data stats: error: {e}", file=sys.stderr)
            return 2
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    stats = {"dataset": args.dataset, "split": args.split, **dataset_stats(convs, args.dataset)}
    print(json.dumps(stats, indent=2))
    return 0


def register(subparsers) -> None:
    """Add ``data`` with its ``stats`` subcommand to the ``memgym`` parser."""
    p = subparsers.add_parser(
        "data", help="inspect benchmark data (LoCoMo, LongMemEval)",
        description="Inspect the benchmark files memgym reads (default: $MEMGYM_DATA or "
                    "../shared/data).",
    )
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    sub.required = True
    s = sub.add_parser(
        "stats", help="print conversation/session/turn/question counts as JSON",
        description="Load a benchmark file and print JSON with conversations, sessions, "
                    "turns, questions, by_category, by_capability (F,T,P,M,A) and, for "
                    "LongMemEval, abstention. Data quirks are reported on stderr. Exit 2 on "
                    "a missing or broken file.",
    )
    s.add_argument("--dataset", required=True, choices=DATASETS, help="which benchmark")
    s.add_argument("--path", default=None,
                   help="the benchmark JSON file (default: locomo/locomo10.json or "
                        "longmemeval/longmemeval_oracle.json under the data root); "
                        "LongMemEval S/M haystack files work too")
    s.add_argument("--split", default=None,
                   help="only this split: train|valid|test (locomo), sft|rl|test (longmemeval)")
    s.add_argument("--splits-path", default=None,
                   help="LongMemEval splits.json (default: longmemeval/splits.json under the "
                        "data root)")
    s.set_defaults(func=_stats)
