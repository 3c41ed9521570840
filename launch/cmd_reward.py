"""``memgym reward audit``: check that the session reward separates expert memory from a
control before spending GPU hours (see :mod:`memgym.rewards.audit`)."""
from __future__ import annotations

import json
from pathlib import Path

from memgym.launch.cmd_synth import embedder_arg
from memgym.llm.checks import at_least
from memgym.llm.errors import ConfigError


def load_policy_tokenizer(spec: str):
    """The policy tokenizer: ``smollm2`` (default, the embedded SmolLM2's) or a local model
    dir (``hf:`` prefix allowed). Never touches the hub. Raises FileNotFoundError."""
    import os

    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    target = spec[3:] if spec.startswith("hf:") else spec
    if target in ("smollm2", "default"):
        from memgym.llm.models import prepare_smollm2_tokenizer

        return AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))
    if not Path(target).is_dir():
        raise FileNotFoundError(f"policy tokenizer dir {target} does not exist")
    return AutoTokenizer.from_pretrained(target, local_files_only=True)


def make_session_reward(args, rt):
    """A :class:`SessionReward` from the shared reward flags (judge, mode, models, top-k)."""
    from memgym.launch.cmd_synth import load_role_backend, make_embedder
    from memgym.rewards.session_reward import SessionReward, SessionRewardConfig

    cfg = SessionRewardConfig(mode=args.mode, judge=args.judge, retrieval_top_k=args.top_k, lam=args.lam,
                              alpha=args.alpha)
    answer = load_role_backend(rt, args.answer_model, "answer", args.concurrency) if cfg.judge != "answer-recall" else None
    judge = None
    if cfg.judge == "llm":
        judge = load_role_backend(rt, args.judge_model or args.answer_model, "judge", args.concurrency)
    return SessionReward(cfg, embedder=make_embedder(args.embedder, rt), tokenizer=load_policy_tokenizer(args.tokenizer),
                         answer_backend=answer, judge_backend=judge)


def add_reward_flags(p) -> None:
    """The session-reward flags of ``reward audit``."""
    p.add_argument("--judge", choices=["answer-recall", "f1", "llm"], default="answer-recall",
                   help="answer-recall (offline, no model), f1 (LoCoMo F1 of --answer-model's answer), llm (judge)")
    p.add_argument("--mode", choices=["counterfactual", "isolated"], default="counterfactual",
                   help="reward bank (default counterfactual: the expert's other session-t ops stay)")
    p.add_argument("--answer_model", "--answer-model", default="hf:smollm2", metavar="SPEC", help="answer model for f1/llm")
    p.add_argument("--judge_model", "--judge-model", default=None, metavar="SPEC", help="judge model for llm (default: answer model)")
    p.add_argument("--tokenizer", default="smollm2", help="policy tokenizer: smollm2 or a local model dir")
    p.add_argument("--embedder", type=embedder_arg(allow_none=False), default="minilm",
                   help="retrieval embedder: minilm (default) | hash:<dim> (tests only) | a model dir")
    p.add_argument("--top_k", "--top-k", type=at_least(1), default=10, help="entries retrieved per question (default 10)")
    p.add_argument("--lam", type=float, default=0.8, help="λ of the length penalty (default 0.8)")
    p.add_argument("--alpha", type=float, default=4.0, help="α, weight of the dominant part (default 4)")
    p.add_argument("--concurrency", type=at_least(1), default=8, help="answer/judge requests in flight (default 8)")
    p.add_argument("--cache", default=None, help="sqlite response cache (default under $MEMGYM_CACHE); 'none' disables")


def _audit(args) -> int:
    from memgym.rewards.audit import run_audit
    from memgym.llm.runtime import Runtime
    from memgym.training.reward_rows import build_rows

    rt = Runtime.from_config(cache=args.cache, batch_size=args.concurrency)
    try:
        reward = make_session_reward(args, rt)
        samples = build_rows(args.trajectories, dataset=args.dataset, data_path=args.path, qa_path=args.qa,
                             embedder=reward.embedder)
        snap = rt.calls_snapshot()
        report = run_audit(samples, reward, control=args.control, batch_size=args.batch_size,
                           progress=not args.quiet)
    except (ValueError, FileNotFoundError) as e:  # the files and settings named on the command line
        raise ConfigError(str(e)) from e
    report["model_calls"] = rt.calls_since(snap)["calls"]
    print(json.dumps(report))
    return 0


def register(sub) -> None:
    p = sub.add_parser("reward", help="inspect the dense session reward")
    s = p.add_subparsers(dest="reward_command", metavar="ACTION")
    s.required = True
    a = s.add_parser("audit", help="expert output vs a control: does the reward separate them?",
                     description="Scores every (session, manager) of expert trajectory files with the expert's own "
                                 "output and with a control (shuffled: the same manager's output from another "
                                 "session; empty: no operations). Prints JSON {expert_mean, control_mean, n, "
                                 "by_manager, ...}. Exit 2 on bad input.")
    a.add_argument("--trajectories", nargs="+", required=True, metavar="F.jsonl", help="expert trajectory files")
    a.add_argument("--control", choices=["shuffled", "empty"], default="shuffled")
    a.add_argument("--dataset", choices=["locomo", "longmemeval"], default="locomo")
    a.add_argument("--path", help="benchmark file (default: $MEMGYM_DATA/...)")
    a.add_argument("--qa", metavar="QA.jsonl", help="session QA from `memgym synth qa` (default: the files' qa)")
    a.add_argument("--batch_size", "--batch-size", type=at_least(1), default=64, help="samples per reward call (default 64)")
    a.add_argument("--quiet", action="store_true", help="no progress bars")
    add_reward_flags(a)
    a.set_defaults(func=_audit)
