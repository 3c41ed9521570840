"""``memgym data ...``: fetch (``download``), check and inspect the benchmark files (LoCoMo, LongMemEval, BEAM)."""
from __future__ import annotations

import argparse
import json
import sys
import time
import warnings
from pathlib import Path

from memgym.data_synth.errors import DataFileNotFoundError, DataFormatError, DataQuirkWarning
from memgym.data_synth.datasets import DATASETS, dataset_stats, load_conversations
from memgym.llm.errors import ConfigError


def _stats(args: argparse.Namespace) -> int:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", DataQuirkWarning)
        try:
            convs = load_conversations(args.dataset, args.path, split=args.split, splits_path=args.splits_path,
                                       beam_truncated=not args.full_chat, beam_strip_markers=not args.keep_markers)
        except (DataFileNotFoundError, DataFormatError, ValueError) as e:  # the file named on the command line
            raise ConfigError(f"error: {e}") from e
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
    s.add_argument("--full_chat", "--full-chat", action="store_true",
                   help="BEAM: read chat.json even where chat_trunecated.json exists (the official "
                        "pipeline reads the truncated one)")
    s.add_argument("--keep_markers", "--keep-markers", action="store_true",
                   help="BEAM: keep the ' ->-> b,k' plan markers in the message text")
    s.add_argument("--splits_path", "--splits-path", default=None,
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
    d = sub.add_parser(
        "download", help="fetch the data from its public sources at pinned revisions, checked by sha256",
        description="Fill DIR with the layout memgym reads: LoCoMo (snap-research/locomo raw files), LongMemEval "
                    "(xiaowu0162/longmemeval-cleaned on the hub; the S subset is derived from the full S file) and "
                    "BEAM (mohammadtavakoli78/BEAM raw files), each at a pinned revision, plus memgym's own files "
                    "(expert trajectories, judge protocols, splits, licences). Every file is checked against its "
                    "recorded sha256 and written atomically; a cut download resumes; files already there and "
                    "verified are kept (a complete folder needs no network). Exit 2 when a host cannot be "
                    "reached (the message lists what to fetch by hand and where to put it), 1 on a checksum "
                    "mismatch or a failed transfer.",
    )
    d.add_argument("dataset", nargs="?", default="all", choices=["locomo", "longmemeval", "beam", "all"],
                   help="which dataset (default: all)")
    d.add_argument("--to", default=None, metavar="DIR",
                   help="the data folder to fill (default: $MEMGYM_DATA, else ../shared/data)")
    d.add_argument("--github_raw", "--github-raw", default=None, metavar="URL",
                   help="base URL of GitHub raw files (default: $MEMGYM_GITHUB_RAW, else "
                        "https://raw.githubusercontent.com)")
    d.add_argument("--hf_endpoint", "--hf-endpoint", default=None, metavar="URL",
                   help="Hugging Face hub endpoint (default: $HF_ENDPOINT, else https://huggingface.co)")
    d.add_argument("--keep_sources", "--keep-sources", action="store_true",
                   help="keep the public files the layout is derived from (DIR/.sources/: the full "
                        "LongMemEval-S and oracle files, 293 MB)")
    d.set_defaults(func=_download)


def _download(args: argparse.Namespace) -> int:
    """Fetch what ``args.to`` lacks; one line per dataset written, or ``verified, nothing to fetch``."""
    from memgym.data_synth.download import DATASETS, download
    from memgym.data_synth.errors import NoNetworkError
    from memgym.data_synth.paths import ENV_VAR, data_root
    from memgym.llm.errors import say_error

    to = Path(args.to).expanduser().resolve() if args.to else data_root()
    datasets = DATASETS if args.dataset == "all" else (args.dataset,)
    t0 = time.perf_counter()
    try:
        report = download(datasets, to, github_raw=args.github_raw, hf_endpoint=args.hf_endpoint,
                          keep_sources=args.keep_sources, log=print)
    except NoNetworkError as e:  # its own line, never cut: it lists every URL left
        say_error("memgym data download", f"no network: {e}")
        return e.exit_status
    if report.nothing_to_fetch:
        print(f"{to}: {report.checked} files verified, nothing to fetch")
    else:
        mb = sum(r.bytes for r in report.written.values()) / 1e6
        print(f"{to}: {report.checked} files verified ({mb:.1f} MB received in {time.perf_counter() - t0:.1f} s)")
    if to != data_root():
        print(f"export {ENV_VAR}={to}")
    return 0


def _check(args: argparse.Namespace) -> int:
    """Print one line per data item and per judge protocol file; exit 1 when any is missing or wrong."""
    from memgym.data_synth.check import DataCheck, check_data
    from memgym.data_synth.paths import data_root
    from memgym.rewards.scoring.judge_protocols import OFFICIAL_SHA256, JudgeProtocolError, official_file_problem, protocol_file

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
