"""``memgym data ...``: inspect the benchmark files (LoCoMo, LongMemEval, BEAM)."""
from __future__ import annotations

import argparse
import json
import sys
import warnings

from data_synth.errors import DataFileNotFoundError, DataFormatError, DataQuirkWarning
from data_synth.datasets import DATASETS, dataset_stats, load_conversations


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
    c = sub.add_parser(
        "check", help="check that every dataset, expert trajectory and judge protocol loads",
        description="Load every file memgym reads from $MEMGYM_DATA (default ../shared/data) with the loaders "
                    "the commands use and print its counts. Exit 1 when any item is missing or its counts differ "
                    "from $MEMGYM_DATA/README.md.",
    )
    c.set_defaults(func=_check)


def _check(args: argparse.Namespace) -> int:
    """Print one line per data item and per judge protocol file; exit 1 when any is missing or wrong."""
    from data_synth.check import DataCheck, check_data
    from data_synth.paths import data_root
    from rewards.scoring.protocols import OFFICIAL_SHA256, JudgeProtocolError, official_file_problem, protocol_file

    print(f"data root: {data_root()}  (set MEMGYM_DATA to move it)")
    checks = check_data()
    for dataset in ("locomo", "longmemeval", "beam"):
        path = protocol_file(dataset)
        try:
            problem = official_file_problem(dataset)
            detail = problem or f"official (sha256 {OFFICIAL_SHA256[path.name][:16]}...)"
            checks.append(DataCheck(f"judge protocol {dataset}", path, not problem, detail))
        except JudgeProtocolError as e:
            checks.append(DataCheck(f"judge protocol {dataset}", path, False, str(e)))
    for c in checks:
        print(f"{'ok ' if c.ok else 'BAD'}  {c.name:<26} {c.detail}" + ("" if c.ok or str(c.path) in c.detail else f"  [{c.path}]"))
    bad = [c.name for c in checks if not c.ok]
    if bad:
        print(f"memgym data check: {len(bad)} of {len(checks)} items missing or wrong: {', '.join(bad)}",
              file=sys.stderr)
    return 1 if bad else 0
