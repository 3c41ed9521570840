"""``memgym data ...``: inspect the benchmark files (LoCoMo, LongMemEval, BEAM)."""
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
            convs = load_conversations(args.dataset, args.path, split=args.split, splits_path=args.splits_path,
                                       beam_truncated=not args.full_chat, beam_strip_markers=not args.keep_markers)
        except (DataFileNotFoundError, DataFormatError, ValueError) as e:
            print(f"memgym data stats: error: {e}", file=sys.stderr)
            return 2
    for w in caught:
        print(f"warning: {w.message}", file=sys.stderr)
    stats = {"dataset": args.dataset, "split": args.split, **dataset_stats(convs, args.dataset, with_ids=args.ids)}
    print(json.dumps(stats, indent=2))
    return 0


def register(subparsers) -> None:
    """Add ``data`` with its ``stats`` subcommand to the ``memgym`` parser."""
    p = subparsers.add_parser(
        "data", help="inspect benchmark data (LoCoMo, LongMemEval, BEAM)",
        description="Inspect the benchmark files memgym reads (default: $MEMGYM_DATA or "
                    "../shared/data).",
    )
    sub = p.add_subparsers(dest="data_command", metavar="SUBCOMMAND")
    sub.required = True
    s = sub.add_parser(
        "stats", help="print conversation/session/turn/question counts as JSON",
        description="Load a benchmark file and print JSON with conversations, sessions, "
                    "turns, questions, by_category, by_capability (F,T,P,M,A), for "
                    "LongMemEval abstention, for BEAM rubric_items and per-chat counts. Data "
                    "quirks are reported on stderr. Exit 2 on a missing or broken file.",
    )
    s.add_argument("--dataset", required=True, choices=DATASETS, help="which benchmark")
    s.add_argument("--path", default=None,
                   help="the benchmark JSON file (default: locomo/locomo10.json or "
                        "longmemeval/longmemeval_oracle.json under the data root; "
                        "LongMemEval S/M haystack files work too); for BEAM a chat folder "
                        "(beam/100K/3), a size folder (beam/1M) or the BEAM root (default beam/)")
    s.add_argument("--split", default=None,
                   help="only this split: train|valid|test (locomo; beam: 100K 3-10 | 100K 11-16 "
                        "| all 1M), sft|rl|test (longmemeval)")
    s.add_argument("--ids", action="store_true",
                   help='add "ids": every question id, in load order (the ids memgym score expects)')
    s.add_argument("--full-chat", action="store_true",
                   help="BEAM: read chat.json even where chat_trunecated.json exists (the official "
                        "pipeline reads the truncated one)")
    s.add_argument("--keep-markers", action="store_true",
                   help="BEAM: keep the ' ->-> b,k' plan markers in the message text")
    s.add_argument("--splits-path", default=None,
                   help="LongMemEval splits.json (default: longmemeval/splits.json under the "
                        "data root)")
    s.set_defaults(func=_stats)
