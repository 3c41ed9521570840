"""``memgym synth qa`` and ``memgym synth trajectories``: reward and SFT data from an expert.

Both write append-only JSONL that resumes after a crash (finished sessions are skipped), and
a ``<out>.summary.json`` with the run's accounting (also printed). Test splits are refused:
this is training data, and nothing tunes on a test split.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from memgym.data_synth.splits import LOCOMO_SPLITS
from memgym.llm.errors import MemgymError
from memgym.llm.checks import at_least



class UsageError(MemgymError, ValueError):
    """A command-line choice that cannot run (exit status 2)."""

    kind = "usage"


def load_role_backend(rt, spec: str, role: str, concurrency: int = 8):
    """The backend of ``spec`` for ``role`` through ``rt`` (shared, cached, accounted), with
    the concurrency knob each kind takes: hf ``batch_size``, openai ``max_concurrency``."""
    from memgym.llm.specs import parse_spec

    kind = parse_spec(spec).kind
    kw = {"batch_size": concurrency} if kind == "hf" else {"max_concurrency": concurrency} if kind == "openai" else {}
    return rt.backend(spec, role, **kw)


def embedder_arg(allow_none: bool = True):
    """An argparse ``type=``: an embedder spec (:data:`memgym.llm.embeddings.EMBEDDER_HELP`);
    ``none`` only when ``allow_none``."""
    def parse(text: str) -> str:
        from memgym.llm.embeddings import check_embedder_spec

        try:
            return check_embedder_spec(text, allow_none=allow_none)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    parse.__name__ = "embedder"
    return parse


def make_embedder(name: str, rt):
    """``minilm``: the cached all-MiniLM-L6-v2 of the runtime; any other spec:
    :func:`memgym.llm.embeddings.load_embedder`."""
    if name == "minilm":
        return rt.embedder
    from memgym.llm.embeddings import load_embedder

    return load_embedder(name)


def test_ids(dataset: str) -> set[str]:
    from memgym.data_synth.splits import split_ids

    return set(LOCOMO_SPLITS["test"]) if dataset == "locomo" else set(split_ids(dataset, "test"))


def select_conversations(args):
    """Load the conversations named by ``--conversations`` or ``--split``; raises
    :class:`UsageError` for a test split or test ids, or when neither is given."""
    from memgym.data_synth.splits import is_test_split, split_ids
    from memgym.data_synth.datasets import conversations_by_id

    if args.split and is_test_split(args.dataset, args.split):
        raise UsageError(f"refusing the test split of {args.dataset}: synthetic QA and trajectories are training "
                         "data, and nothing tunes on a test split")
    ids = args.conversations or (split_ids(args.dataset, args.split) if args.split else None)
    if not ids:
        raise UsageError("name the conversations with --conversations ID [ID ...] or --split NAME")
    bad = sorted(set(ids) & test_ids(args.dataset))
    if bad:
        raise UsageError(f"refusing test-split conversations of {args.dataset}: {', '.join(bad)}")
    convs = conversations_by_id(args.dataset, ids, args.path)
    return [convs[i] for i in dict.fromkeys(ids)]


def _runtime(args):
    from memgym.llm.runtime import Runtime

    return Runtime.from_config(cache=args.cache, batch_size=args.concurrency)


def _write_summary(out: str, summary: dict) -> None:
    path = Path(f"{out}.summary.json")
    path.write_text(json.dumps(summary, indent=2) + "\n", encoding="utf-8")
    print(json.dumps(summary))


def _qa(args) -> int:
    from memgym.data_synth.synth_qa import synth_qa
    from memgym.llm.base import GenerationParams

    try:
        convs = select_conversations(args)
        if args.source == "expert" and not args.expert:
            raise UsageError("--source expert needs --expert SPEC")
    except (ValueError, FileNotFoundError) as e:  # a selection or file named on the command line
        raise UsageError(str(e)) from e
    rt = _runtime(args)
    backend = embedder = None
    if args.source == "expert":
        backend = load_role_backend(rt, args.expert, "expert", args.concurrency)
        embedder = make_embedder(args.embedder, rt)
    snap = rt.calls_snapshot()
    try:
        stats = synth_qa(convs, args.out, source=args.source, backend=backend, embedder=embedder, j=args.j,
                         max_tries=args.max_tries, concurrency=args.concurrency, n_sessions=args.n_sessions,
                         params=GenerationParams(max_new_tokens=args.max_new_tokens, temperature=args.temperature,
                                                 seed=args.seed),
                         progress=not args.quiet, constrained=args.constrained)
    except ValueError as e:
        raise UsageError(str(e)) from e
    _write_summary(args.out, {"out": args.out, "source": args.source, "expert": args.expert,
                              **stats.to_json(), "runtime": rt.calls_since(snap)})
    if stats.sessions_written and stats.sessions_empty == stats.sessions_written:
        print(f"memgym synth qa: all {stats.sessions_written} session(s) came back with no question; nothing usable "
              f"was produced (see the rejected counts above; rerun to retry them)", file=sys.stderr)
        return 1
    if not stats.sessions_written and not stats.sessions_resumed:
        print("memgym synth qa: no session to write (check --conversations/--split and --n-sessions)", file=sys.stderr)
        return 1
    return 0


def _trajectories(args) -> int:
    from memgym.data_synth.qa_format import load_session_qa
    from memgym.data_synth.trajectories import synth_trajectories
    from memgym.llm.base import GenerationParams

    try:
        convs = select_conversations(args)
        qa = None
        if args.qa:
            qa = {k: [{"question": q.question, "answer": q.answer, "evidence": list(q.evidence), "kind": q.category}
                      for q in items] for k, items in load_session_qa(args.qa).items()}
    except (ValueError, FileNotFoundError) as e:  # a selection, QA file or file named on the command line
        raise UsageError(str(e)) from e
    rt = _runtime(args)
    backend = load_role_backend(rt, args.expert, "expert", args.concurrency)
    snap = rt.calls_snapshot()
    stats = synth_trajectories(convs, args.out, backend=backend, embedder=make_embedder(args.embedder, rt), qa=qa,
                               max_tries=args.max_tries, n_sessions=args.n_sessions,
                               params=GenerationParams(max_new_tokens=args.max_new_tokens,
                                                       temperature=args.temperature, seed=args.seed),
                               progress=not args.quiet, constrained=args.constrained)
    _write_summary(args.out, {"out": args.out, "expert": args.expert, **stats.to_json(),
                              "runtime": rt.calls_since(snap)})
    return 1 if stats.failed else 0


def _yes_no(text: str) -> bool:
    v = text.strip().lower()
    if v not in ("true", "false", "yes", "no", "1", "0"):
        raise argparse.ArgumentTypeError(f"expected true or false, got {text!r}")
    return v in ("true", "yes", "1")


def _common(p: argparse.ArgumentParser, expert_required: bool) -> None:
    p.add_argument("--dataset", choices=["locomo", "longmemeval"], default="locomo")
    p.add_argument("--path", help="benchmark file (default: $MEMGYM_DATA/...)")
    p.add_argument("--split", help="a training split (locomo: train|valid; longmemeval: sft|rl); test is refused")
    p.add_argument("--conversations", nargs="+", metavar="ID", help="conversation / question ids (instead of --split)")
    p.add_argument("--n_sessions", "--n-sessions", type=at_least(1), metavar="N", help="first N sessions of each conversation only")
    p.add_argument("--expert", required=expert_required, metavar="SPEC",
                   help="expert backend: openai:<url>#<model> | hf:<dir> | hf:smollm2 | vllm:<dir>")
    p.add_argument("--out", required=True, metavar="F.jsonl", help="output JSONL (resumed if it exists)")
    p.add_argument("--max_tries", "--max-tries", type=at_least(1), default=3, help="attempts per session before giving up (default 3)")
    p.add_argument("--concurrency", type=at_least(1), default=8,
                   help="requests in flight (openai) / generation batch (hf) (default 8)")
    p.add_argument("--max_new_tokens", "--max-new-tokens", type=at_least(1), default=1024, help="expert tokens per output (default 1024)")
    p.add_argument("--temperature", type=at_least(0.0, float), default=0.0, help="expert sampling temperature (default 0: greedy)")
    p.add_argument("--seed", type=int, default=None, help="sampling seed (makes sampled outputs cacheable)")
    p.add_argument("--embedder", type=embedder_arg(), default="minilm",
                   help="ranks the entries a prompt shows: minilm (default) | hash:<dim> (tests only) | none | a model dir")
    p.add_argument("--cache", default=None, help="sqlite response cache (default under $MEMGYM_CACHE); 'none' disables")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--constrained", type=_yes_no, nargs="?", const=True, default=False, metavar="true|false",
                   help="decode the expert's replies under their JSON schema (structured outputs: response_format "
                        "on openai, grammar on hf, structured outputs on vllm); default false")


def register(sub) -> None:
    p = sub.add_parser("synth", help="synthetic session QA and expert trajectories (resumable)")
    s = p.add_subparsers(dest="synth_command", metavar="WHAT")
    s.required = True
    q = s.add_parser("qa", help="J validated QA per session, by an expert model or from the benchmark",
                     description="Writes one JSONL line per session {conversation_id, session, date, qa:[{question, "
                                 "answer, evidence, kind}], ...}: J questions (~50% single-session, 30% "
                                 "multi-session, 20% temporal) with evidence turn ids, validated (unknown evidence "
                                 "ids, empty answers, near-duplicates, unparsable output are rejected and counted) and "
                                 "regenerated up to --max-tries. Resumes after a crash. --source benchmark buckets "
                                 "the benchmark's own QA by the session of its latest evidence (training splits "
                                 "only). Prints and writes <out>.summary.json. Exit 2 on a usage error or test split.")
    _common(q, expert_required=False)
    q.add_argument("--source", choices=["expert", "benchmark"], default="expert")
    q.add_argument("--j", type=at_least(1), default=5, help="questions per session (default 5)")
    q.set_defaults(func=_qa)
    t = s.add_parser("trajectories", help="expert memory-construction trajectories, validated by replay",
                     description="Runs the four managers with the expert over each session and writes lines in "
                                 "the format of shared/data/expert/ (validated by replay before writing). An invalid "
                                 "output is retried with the error shown, up to --max-tries; a session that still "
                                 "fails is listed in the summary and ends that conversation (exit 1). Resumable.")
    _common(t, expert_required=True)
    t.add_argument("--qa", metavar="QA.jsonl", help="a `synth qa` file whose questions go into each line's qa")
    t.set_defaults(func=_trajectories)
