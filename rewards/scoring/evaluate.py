"""The main job: build the bank session by session, answer the QA from retrieved memory,
score the answers, and report.

Config + runner pair in the TRL style: :class:`EvalConfig` is parsed by ``trl.TrlParser``
from a YAML recipe plus CLI overrides; :func:`run_eval` does the work.
Scores: LoCoMo token F1 by default (official rules, :mod:`rewards.scoring.metrics`); ``scorer: llm``
picks the dataset's official judge under ``judge_protocol`` (:func:`rewards.scoring.scorers.make_scorer`),
``rubric-recall`` the offline BEAM proxy; answer-recall of the retrieved context is always
reported beside it (it needs no model). Every column's numbers are
:func:`rewards.scoring.summary.summarise` of its :class:`rewards.scoring.summary.QuestionResult` rows, the same
summary ``memgym program eval`` and ``memgym score`` give. The judge sees the whole answer.
Sessions longer than the extractor's context are built in segments
(:func:`memory_bank.construct.construct`); the report counts them.
"""
from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import asdict, dataclass, field
from pathlib import Path

from tqdm.auto import tqdm

from data_synth.datasets import check_selection
from data_synth.expert import ExpertExtractor
from data_synth.extractors import make_extractor
from llm.base import GenerationParams
from llm.checks import require
from llm.runtime import Runtime
from memory_bank.actions import MANAGERS
from memory_bank.construct import construct
from memory_bank.retrieval import BankRetriever
from memory_bank.schema import Conversation
from rewards.scoring.answer import answer_questions, answer_system_prompt
from rewards.scoring.scorers import make_scorer
from rewards.scoring.selection import (QuestionSelection, answer_tokens_for, extractor_segment_tokens_field,
                                       load_selected)
from rewards.scoring.summary import QuestionResult, score_questions, summarise


@dataclass
class EvalConfig(QuestionSelection):
    """A ``memgym eval`` recipe. Every field can be overridden on the command line."""

    CHECKS = { "top_k": {"min": 1},
              "extractor_max_new_tokens": {"min": 1}, "extractor_context_tokens": {"min": 2},
              "extractor_segment_tokens": {"min": 1},
              "answer_max_new_tokens": {"min": 1}, "batch_size": {"min": 1},
              "extractor": {"spec": "extractor", "options": ("constrained", "free")},
              "compare": {"spec": "extractor", "options": ("constrained", "free")},
              "constrained_max_chars": {"min": 1}, "constrained_max_items": {"min": 1},
              "answer_model": {"spec": "backend"}, "judge_model": {"spec": "backend"}, "out": {"out_dir": True},
              "request_timeout_s": {"min": 0.001}, "request_retries": {"min": 0}}

    extractor: str = field(default="hf:smollm2", metadata={"help": "hf:<path> | openai:<url>#<model> | "
                                                                     "expert:<trajectories.jsonl>"})
    compare: list[str] = field(default_factory=list,
                               metadata={"help": "more extractor specs run on the same QA, side by side; a "
                                                 "model spec may end in ' constrained' or ' free' to override "
                                                 "`constrained` for that column"})
    constrained: bool = field(default=False, metadata={"help": "decode model extractors' outputs under their "
                                                                 "JSON schemas (structured outputs)"})
    constrained_max_chars: int | None = field(default=None, metadata={
        "help": "constrained columns: at most this many characters per string of a manager output"})
    constrained_max_items: int | None = field(default=None, metadata={
        "help": "constrained columns: at most this many operations (and MERGE ids) per output"})
    answer_model: str = field(default="hf:smollm2", metadata={"help": "backend spec of the answer model"})
    scorer: str = field(default="f1", metadata={"help": "f1 | answer-recall | rubric-recall (beam) | llm (the "
                                                        "dataset's official judge)",
                                                "choices": ("f1", "answer-recall", "rubric-recall", "llm")})
    judge_model: str | None = field(default=None, metadata={"help": "backend spec of the LLM judge (scorer llm)"})
    top_k: int = field(default=10, metadata={"help": "entries retrieved per question"})
    extractor_max_new_tokens: int = field(default=512, metadata={"help": "tokens per manager output"})
    extractor_context_tokens: int | None = field(default=None, metadata={
        "help": "the extractor's context window in tokens; a session whose prompt does not fit is built in "
                "segments (default: what the backend reports, e.g. max_position_embeddings for hf; none known = "
                "no segmentation)"})
    extractor_segment_tokens: int | None = extractor_segment_tokens_field()
    answer_max_new_tokens: int | None = field(default=None, metadata={
        "help": "tokens per answer (default by dataset: locomo 48, longmemeval 128, beam 512, so lists and "
                "summaries reach the judge whole)"})
    batch_size: int = field(default=8, metadata={"help": "hf backend generation batch"})
    cache: str | None = field(default=None, metadata={"help": "sqlite response cache (default: under "
                                                               "$MEMGYM_CACHE); 'none' disables"})
    request_timeout_s: float | None = field(default=None, metadata={
        "help": "seconds per request to an openai: server (default $MEMGYM_REQUEST_TIMEOUT_S or 60)"})
    request_retries: int | None = field(default=None, metadata={
        "help": "retries of a failed openai: request, each logged with its reason (default $MEMGYM_REQUEST_RETRIES "
                "or 5)"})
    out: str = field(default="runs/eval", metadata={"help": "output directory"})
    progress: bool = field(default=True, metadata={"help": "progress bars: on (true) or off (--no_progress)"})

    def __post_init__(self):
        if isinstance(self.compare, str):
            self.compare = [self.compare]
        self.compare = [c for c in self.compare if c.lower() not in ("none", "")]
        for c in [self.extractor, *self.compare]:
            parse_column(c, self.constrained)  # a bad option word fails before any model loads
        super().__post_init__()  # the sections' defaults and checks
        require(self, "scorer", "llm", "judge_model", "(a backend spec of the LLM judge)")
        check_selection(self.dataset, self.path, self.conversations, self.split, self.scorer)


def parse_column(text: str, default_constrained: bool) -> tuple[str, bool, str]:
    """``"<spec>[ constrained|free]"`` → ``(spec, constrained, label)``.

    The option word overrides ``default_constrained`` for that column; ``expert:`` columns
    replay files and are never constrained. ``label`` names the column in reports: the spec,
    plus `` (constrained)`` when constrained. Raises ValueError for another option word."""
    spec, _, opt = text.strip().partition(" ")
    opt = opt.strip()
    if opt not in ("", "constrained", "free"):
        raise ValueError(f"extractor column {text!r}: the word after the spec must be 'constrained' or 'free', "
                         f"got {opt!r}")
    constrained = default_constrained if not opt else opt == "constrained"
    if spec.startswith("expert:"):
        if opt == "constrained":
            raise ValueError(f"extractor column {text!r}: an expert replay is not generated, so it cannot be constrained")
        constrained = False
    return spec, constrained, spec + (" (constrained)" if constrained else "")


def load_eval_conversations(cfg) -> list[Conversation]:
    """The recipe's conversations (:func:`rewards.scoring.selection.load_selected`)."""
    return load_selected(cfg)


def evaluate_extractor(column: str, convs: list[Conversation], cfg: EvalConfig, rt: Runtime) -> dict:
    """Build, retrieve, answer and score for one extractor column (``"<spec>[ constrained|free]"``,
    see :func:`parse_column`). Returns the report dict (``extractor`` = the spec; ``settings``
    says whether it was constrained) and writes nothing (see :func:`run_eval`)."""
    t0 = time.time()
    calls0 = rt.calls_snapshot()
    spec, constrained, label = parse_column(column, cfg.constrained)
    extractor = make_extractor(spec, rt, cfg.extractor_max_new_tokens, constrained=constrained,
                               max_chars=cfg.constrained_max_chars, max_items=cfg.constrained_max_items,
                               context_tokens=cfg.extractor_context_tokens, conversations=convs,
                               segment_tokens=cfg.extractor_segment_tokens)
    answerer = rt.backend(cfg.answer_model, role="answer")
    scorer = make_scorer(cfg.scorer, rt.backend(cfg.judge_model, role="judge") if cfg.judge_model else None,
                         dataset=cfg.dataset, judge_protocol=cfg.judge_protocol)
    answer_tokens = answer_tokens_for(cfg.dataset, cfg.answer_max_new_tokens)
    rows: list[QuestionResult] = []
    attempts, fails = defaultdict(int), defaultdict(int)
    fail_types: dict[str, int] = defaultdict(int)
    empty_answers, empty_sessions = 0, []
    segments: dict[str, dict[int, int]] = {}
    retrieved_counts: list[dict] = []
    for conv in convs:
        n = len(conv.sessions)
        missing = extractor.missing_sessions(conv) if isinstance(extractor, ExpertExtractor) else []
        if missing:
            n = next(i for i, s in enumerate(conv.sessions) if s.index in missing)  # the covered prefix
            raise ValueError(f"{extractor.name} covers only {n} of {len(conv.sessions)} sessions of {conv.id}")
        built = construct(conv, extractor, embedder=rt.embedder, progress=cfg.progress)
        segments[conv.id] = dict(built.segments)
        for m in MANAGERS:
            attempts[m] += built.attempts[m]
        for f in built.failures:
            fails[f.manager] += 1
            fail_types[f.error_type] += 1
        empty_sessions += [f"{conv.id}/{i}" for i in built.empty_sessions]
        if not conv.questions:
            continue
        retrieved = BankRetriever(built.bank, rt.embedder, cfg.top_k).retrieve([q.question for q in conv.questions])
        contexts = [r.render() for r in retrieved]
        preds = []
        bs = max(1, cfg.batch_size)
        items = [(q.question, c, q.question_date) for q, c in zip(conv.questions, contexts)]
        for i in tqdm(range(0, len(items), bs), desc=f"answer {conv.id}", disable=not cfg.progress, unit="batch"):
            preds += answer_questions(answerer, items[i: i + bs], GenerationParams(max_new_tokens=answer_tokens),
                                      system_prompt=answer_system_prompt(cfg.dataset))
        if scorer.needs_prediction:
            empty_answers += sum(not p.strip() for p in preds)
        rows += score_questions(scorer, cfg.dataset, [(conv.id, q, p, c) for q, p, c in zip(conv.questions, preds,
                                                                                            contexts)])
        retrieved_counts += [r.counts for r in retrieved]
    calls = rt.calls_since(calls0)
    from rewards.scoring.official import judge_stats
    from rewards.scoring.protocols import protocol_note
    summary = summarise(cfg.dataset, rows)
    return {
        "extractor": spec,
        "column": label,
        "settings": {"constrained": constrained, "extractor_max_new_tokens": cfg.extractor_max_new_tokens,
                     **({"extractor_segment_tokens": cfg.extractor_segment_tokens}
                        if cfg.extractor_segment_tokens and not isinstance(extractor, ExpertExtractor) else {}),
                     "answer_max_new_tokens": answer_tokens,
                     **({"constrained_max_chars": cfg.constrained_max_chars,
                         "constrained_max_items": cfg.constrained_max_items} if constrained else {})},
        "answer_model": cfg.answer_model,
        "dataset": cfg.dataset,
        "scorer": cfg.scorer,
        "judge_protocol": cfg.judge_protocol,
        **({"judge_note": protocol_note(cfg.dataset, cfg.judge_protocol)} if cfg.scorer == "llm" else {}),
        **summary,
        "overall_recall": summarise(None, [{**r.to_dict(), "score": r.recall} for r in rows])["overall"],
        "judge_calls": judge_stats(scorer),
        "segments": {c: {"sessions": len(v), "segments": sum(v.values()),
                         "split_sessions": {str(k): n for k, n in v.items() if n > 1}} for c, v in segments.items()},
        "format_failure_rate": {m: (fails[m] / attempts[m] if attempts[m] else 0.0) for m in MANAGERS},
        "format_failures_by_type": dict(sorted(fail_types.items())),
        "empty_answers": empty_answers,
        "empty_sessions": empty_sessions,
        "judge_unparsable": getattr(scorer, "parse_failures", 0),
        "model_calls": calls["calls"],
        "tokens": calls["tokens"],
        "wall_s": round(time.time() - t0, 2),
        "predictions": [{**r.to_dict(), "retrieved": c} for r, c in zip(rows, retrieved_counts)],
    }


def run_eval(cfg: EvalConfig, rt: Runtime | None = None) -> dict:
    """Run the recipe for ``cfg.extractor`` and every ``cfg.compare`` spec; write
    ``report.json``, ``report.md`` and ``predictions.jsonl`` under ``cfg.out``."""
    from rewards.scoring.report import write_eval_report

    t0 = time.time()
    rt = rt or Runtime.from_config(cache=cfg.cache, batch_size=cfg.batch_size, request_timeout_s=cfg.request_timeout_s,
                                   request_retries=cfg.request_retries)
    convs = load_eval_conversations(cfg)
    main = evaluate_extractor(cfg.extractor, convs, cfg, rt)
    main["compare"] = {}
    for column in cfg.compare:
        r = evaluate_extractor(column, convs, cfg, rt)
        if r["column"] in main["compare"] or r["column"] == main["column"]:
            raise ValueError(f"extractor column {r['column']!r} appears twice in the recipe")
        main["compare"][r["column"]] = r
    main["config"] = asdict(cfg)
    main["wall_s"] = round(time.time() - t0, 2)
    write_eval_report(main, Path(cfg.out))
    return main
