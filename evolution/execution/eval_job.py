"""``memgym eval``: each extractor column (``extractor``, then every ``compare`` spec) builds
memory on the recipe's conversations and ``program`` (default ``memory_bank/programs/bank.py``)
retrieves with the question as the query, through
:func:`evolution.execution.program_eval.evaluate_program`. :func:`run_eval` writes
``report.json``, ``report.md``, ``predictions.jsonl`` and ``by_category.png``; answer-recall
is always reported beside the recipe's scorer.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from data_synth.datasets import check_selection
from data_synth.extractors import make_extractor
from evolution.execution.program_eval import evaluate_program, open_stage_cache
from evolution.execution.runner import ProgramRunner, RunnerSettings
from llm.checks import require
from llm.errors import ConfigError
from llm.runtime import Runtime
from memory_bank.actions import MANAGERS
from memory_bank.programs import bank_program_path, read_program_source
from rewards.scoring.selection import (QuestionSelection, answer_tokens_for, extractor_segment_tokens_field,
                                       load_selected)
from rewards.scoring.summary import summarise


@dataclass
class EvalConfig(QuestionSelection):
    """A ``memgym eval`` recipe. Every field can be overridden on the command line."""

    CHECKS = {
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
    program: str = field(default=str(bank_program_path()), metadata={
        "help": "memory program the extractors' entries are indexed into and retrieved from (default "
                "memory_bank/programs/bank.py: MemBuilder's four-part bank, core block + top-10 entries)"})
    diagnostics: bool = field(default=True, metadata={"help": "compute d_ext/d_idx/d_ret per column"})
    stage_cache: str | None = field(default=None, metadata={
        "help": "stage-output cache (sqlite; default $MEMGYM_CACHE/stages.sqlite); 'none' = memory only"})
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
        super().__post_init__()  # the data section's default conversations and every class's CHECKS
        require(self, "scorer", "llm", "judge_model", "(a backend spec of the LLM judge)")
        check_selection(self.dataset, self.path, self.conversations, self.split, self.scorer)


def parse_column(text: str, default_constrained: bool) -> tuple[str, bool, str]:
    """``"<spec>[ constrained|free]"`` → ``(spec, constrained, label)``; ``expert:`` columns are
    never constrained. Raises ConfigError for another option word.
    """
    spec, _, opt = text.strip().partition(" ")
    opt = opt.strip()
    if opt not in ("", "constrained", "free"):
        raise ConfigError(f"extractor column {text!r}: the word after the spec must be 'constrained' or 'free', "
                         f"got {opt!r}")
    constrained = default_constrained if not opt else opt == "constrained"
    if spec.startswith("expert:"):
        if opt == "constrained":
            raise ConfigError(f"extractor column {text!r}: an expert replay is not generated, so it cannot be constrained")
        constrained = False
    return spec, constrained, spec + (" (constrained)" if constrained else "")


def _column_settings(cfg: EvalConfig, spec: str, constrained: bool) -> RunnerSettings:
    return RunnerSettings(extractor=spec, task_model=cfg.answer_model, plan_mode="question", scorer=cfg.scorer,
                          judge_model=cfg.judge_model, dataset=cfg.dataset, judge_protocol=cfg.judge_protocol,
                          extractor_max_new_tokens=cfg.extractor_max_new_tokens,
                          extractor_context_tokens=cfg.extractor_context_tokens,
                          extractor_segment_tokens=cfg.extractor_segment_tokens,
                          answer_max_new_tokens=answer_tokens_for(cfg.dataset, cfg.answer_max_new_tokens),
                          constrained=constrained, constrained_max_chars=cfg.constrained_max_chars,
                          constrained_max_items=cfg.constrained_max_items, diagnostics=cfg.diagnostics,
                          progress=cfg.progress)


def _retrieved_counts(text: str) -> dict[str, int]:
    """Entries per part in a bank program's retrieved text (its ``[id] (part) text`` lines)."""
    counts = {p: 0 for p in MANAGERS if p != "core"}
    for line in text.splitlines():
        for p in counts:
            if line.startswith("[") and f"] ({p}) " in line:
                counts[p] += 1
    return counts


def evaluate_column(column: str, source: str, convs, cfg: EvalConfig, rt: Runtime, cache) -> dict:
    """One extractor column's report dict (summary, recall, format failures, segments, model calls,
    diagnostics, predictions). Raises :class:`evolution.execution.runner.ProgramRunError`.
    """
    from rewards.scoring.metrics import answer_recall
    from rewards.scoring.protocols import protocol_note

    spec, constrained, label = parse_column(column, cfg.constrained)
    settings = _column_settings(cfg, spec, constrained)
    ev, run = evaluate_program(source, convs, ProgramRunner(rt, settings, cache), diagnostics=cfg.diagnostics)
    ex = ev.extraction
    attempts, fails = ex.get("manager_attempts", {}), ex.get("manager_failures", {})
    preds = []
    for t in run.tasks:
        cap = t.qa.capability.value if t.qa.capability else None
        row = {"conversation": t.conversation, "id": t.qa.id, "question": t.qa.question, "gold": str(t.qa.answer),
               "category": str(t.qa.category), "capability": cap, "prediction": t.prediction, "score": t.score,
               "missing": False, "recall": answer_recall(t.qa.answer, t.retrieved), "judge": t.judge,
               "detail": t.detail, "trace": None, "retrieved": _retrieved_counts(t.retrieved)}
        preds.append(row)
    summary = summarise(cfg.dataset, preds)
    rename = {"task": "answer"}
    return {
        "extractor": spec, "column": label, "program": cfg.program,
        "settings": {"constrained": constrained, "extractor_max_new_tokens": cfg.extractor_max_new_tokens,
                     **({"extractor_segment_tokens": cfg.extractor_segment_tokens}
                        if cfg.extractor_segment_tokens and not spec.startswith("expert:") else {}),
                     "answer_max_new_tokens": settings.answer_max_new_tokens,
                     **({"constrained_max_chars": cfg.constrained_max_chars,
                         "constrained_max_items": cfg.constrained_max_items} if constrained else {})},
        "answer_model": cfg.answer_model, "dataset": cfg.dataset, "scorer": cfg.scorer,
        "judge_protocol": cfg.judge_protocol,
        **({"judge_note": protocol_note(cfg.dataset, cfg.judge_protocol)} if cfg.scorer == "llm" else {}),
        **summary,
        "overall_recall": summarise(None, [{**r, "score": r["recall"]} for r in preds])["overall"],
        "judge_calls": ev.judge_calls,
        "segments": ex.get("segments_by_conversation", {}),
        "format_failure_rate": {m: (fails.get(m, 0) / attempts[m] if attempts.get(m) else 0.0) for m in MANAGERS},
        "format_failures_by_type": dict(sorted(ex.get("failure_types", {}).items())),
        "empty_answers": ev.empty_answers, "empty_sessions": ex.get("empty_sessions", []),
        "judge_unparsable": ev.judge_unparsable,
        "model_calls": {rename.get(k, k): v for k, v in ev.model_calls.items()},
        "tokens": {rename.get(k, k): v for k, v in ev.tokens.items()},
        "diagnostics": ev.diagnostics, "stage_items": ev.stage_items, "retrieve_errors": ev.retrieve_errors,
        "wall_s": ev.wall_s,
        "predictions": preds,
    }


def run_eval(cfg: EvalConfig, rt: Runtime | None = None) -> dict:
    """Run every column through ``cfg.program`` and write the report files under ``cfg.out``.
    Raises ConfigError (a column named twice, a program that fails validation), FileNotFoundError.
    """
    from evolution.execution.validate import ValidationLimits, validate_program
    from rewards.scoring.report import write_eval_report

    t0 = time.time()
    source = read_program_source(cfg.program)
    # the cheap checks first (caches, data), then the program's validation, then the models
    rt = rt or Runtime.from_config(cache=cfg.cache, batch_size=cfg.batch_size, request_timeout_s=cfg.request_timeout_s,
                                   request_retries=cfg.request_retries)
    convs = load_selected(cfg)
    for column in (cfg.extractor, *cfg.compare):  # an expert replay must cover every selected session
        spec = parse_column(column, cfg.constrained)[0]
        if spec.startswith("expert:"):
            make_extractor(spec, None, conversations=convs)
    cache = open_stage_cache(cfg.stage_cache)
    try:
        res = validate_program(source, None, ValidationLimits(), progress=cfg.progress)
        if not res.ok:
            raise ConfigError(f"program {cfg.program} fails validation at level {res.level}: {res.reason}")
        main = evaluate_column(cfg.extractor, source, convs, cfg, rt, cache)
        main["compare"] = {}
        for column in cfg.compare:
            r = evaluate_column(column, source, convs, cfg, rt, cache)
            if r["column"] in main["compare"] or r["column"] == main["column"]:
                raise ConfigError(f"extractor column {r['column']!r} appears twice in the recipe")
            main["compare"][r["column"]] = r
    finally:
        cache.close()
    main["config"] = asdict(cfg)
    main["wall_s"] = round(time.time() - t0, 2)
    write_eval_report(main, Path(cfg.out))
    return main
