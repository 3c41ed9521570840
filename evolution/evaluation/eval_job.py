"""``memgym eval``: each extractor column (``extractor``, then every ``compare`` spec) builds
memory on the recipe's conversations and ``program`` (default ``memory_bank/programs/bank.py``)
retrieves with the question as the query, through
:func:`memgym.evolution.execution.runner.evaluate_program`. :func:`run_eval` writes
``report.json``, ``report.md``, ``predictions.jsonl`` and ``by_category.png``; answer-recall
is always reported beside the recipe's scorer. The recipe is composed of the settings sections
(:mod:`memgym.evolution.execution.settings`); a column's runner settings are the recipe with that
column's ``extractor`` and ``constrained`` (:func:`column_settings`).
"""
from __future__ import annotations

import dataclasses
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memgym.data_synth.datasets import check_selection
from memgym.data_synth.extractors import make_extractor
from memgym.evolution.execution.runner import ProgramRunner, evaluate_program
from memgym.evolution.execution.settings import OutputSection, ProgramSection, RunnerSettings
from memgym.evolution.execution.stage_cache import open_stage_cache
from memgym.llm.errors import ConfigError
from memgym.llm.runtime import Runtime
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.programs import bank_program_path, read_program_source
from memgym.rewards.scoring.selection import QuestionSelection, load_selected
from memgym.rewards.scoring.summary import summarise

_COLUMN_OPTIONS = ("constrained", "free")


@dataclass
class EvalConfig(QuestionSelection, RunnerSettings, OutputSection, ProgramSection):
    """A ``memgym eval`` recipe: the data (:class:`QuestionSelection`), models and runner
    sections (:class:`memgym.evolution.execution.settings.RunnerSettings`: ``task_model`` answers;
    ``extractor`` is the first column), the output section and the program, plus the
    ``compare`` columns. Every field can be overridden on the command line."""

    COMMAND_DEFAULTS = {"extractor": "hf:smollm2", "plan_mode": "question", "scorer": "f1", "out": "runs/eval",
                        "program": str(bank_program_path())}
    CHECKS = {"extractor": {"spec": "extractor", "options": _COLUMN_OPTIONS},
              "compare": {"spec": "extractor", "options": _COLUMN_OPTIONS}}
    RENAMED = {"answer_model": "task_model"}
    """Old field names -> the field that replaced them (named by the unknown-field message)."""

    compare: list[str] = field(default_factory=list,
                               metadata={"help": "more extractor specs run on the same QA, side by side; a "
                                                 "model spec may end in ' constrained' or ' free' to override "
                                                 "`constrained` for that column"})

    def __post_init__(self):
        if isinstance(self.compare, str):
            self.compare = [self.compare]
        self.compare = [c for c in self.compare if c.lower() not in ("none", "")]
        for c in [self.extractor, *self.compare]:
            if c is not None:
                parse_column(c, self.constrained)  # a bad option word fails before any model loads
        super().__post_init__()  # the sections' command defaults, every class's CHECKS and check()

    def check(self) -> None:
        super().check()
        check_selection(self.dataset, self.path, self.conversations, self.split, self.scorer)


def parse_column(text: str, default_constrained: bool) -> tuple[str, bool, str]:
    """``"<spec>[ constrained|free]"`` → ``(spec, constrained, label)``; ``expert:`` columns are
    never constrained. Raises ConfigError for another option word.
    """
    spec, _, opt = text.strip().partition(" ")
    opt = opt.strip()
    if opt not in ("", *_COLUMN_OPTIONS):
        raise ConfigError(f"extractor column {text!r}: the word after the spec must be 'constrained' or 'free', "
                         f"got {opt!r}")
    constrained = default_constrained if not opt else opt == "constrained"
    if spec.startswith("expert:"):
        if opt == "constrained":
            raise ConfigError(f"extractor column {text!r}: an expert replay is not generated, so it cannot be constrained")
        constrained = False
    return spec, constrained, spec + (" (constrained)" if constrained else "")


def column_settings(cfg: EvalConfig, column: str) -> tuple[EvalConfig, str]:
    """The runner settings of one extractor column and its report label: the recipe with the
    column's spec as ``extractor`` and its ``constrained`` (:func:`parse_column`)."""
    spec, constrained, label = parse_column(column, cfg.constrained)
    return dataclasses.replace(cfg, extractor=spec, constrained=constrained), label


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
    diagnostics, predictions; ``answer_model`` is the recipe's ``task_model``). Raises
    :class:`memgym.evolution.execution.runner.ProgramRunError`.
    """
    settings, label = column_settings(cfg, column)
    spec, constrained = settings.extractor, settings.constrained
    ev, _ = evaluate_program(source, convs, ProgramRunner(rt, settings, cache), diagnostics=cfg.diagnostics)
    ex = ev.extraction
    attempts, fails = ex.get("manager_attempts", {}), ex.get("manager_failures", {})
    recall = summarise(None, [dataclasses.replace(q, score=q.recall) for q in ev.questions])["overall"]
    rename = {"task": "answer"}
    return {
        "extractor": spec, "column": label, "program": cfg.program,
        "settings": {"constrained": constrained, "extractor_max_new_tokens": cfg.extractor_max_new_tokens,
                     **({"extractor_segment_tokens": cfg.extractor_segment_tokens}
                        if cfg.extractor_segment_tokens and not spec.startswith("expert:") else {}),
                     "answer_max_new_tokens": settings.answer_tokens,
                     **({"constrained_max_chars": cfg.constrained_max_chars,
                         "constrained_max_items": cfg.constrained_max_items} if constrained else {})},
        "answer_model": cfg.task_model, "dataset": cfg.dataset, "scorer": cfg.scorer,
        "judge_protocol": cfg.judge_protocol, **({"judge_note": ev.judge_note} if ev.judge_note else {}),
        **ev.summary, "overall_recall": recall,
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
        "predictions": [{**q.to_dict(), "trace": None, "retrieved": _retrieved_counts(q.retrieved)}
                        for q in ev.questions],
    }


def run_card(cfg: EvalConfig, rt: Runtime, wall_s: float) -> dict:
    """The run card of an eval (:func:`memgym.llm.runcard.build_card`): every column's extractor spec
    beside the recipe's other models; cost = the runtime's counts over all columns."""
    from memgym.llm.runcard import build_card
    from memgym.rewards.scoring.judge_protocols import protocol_card

    columns = [parse_column(c, cfg.constrained)[0] for c in (cfg.extractor, *cfg.compare)]
    models = {**{("extractor" if i == 0 else f"compare {i}"): s for i, s in enumerate(columns)},
              **{k: v for k, v in cfg.model_specs().items() if k != "extractor"}}
    return build_card(recipe=asdict(cfg), models=models, runtime=rt,
                      judge=protocol_card(cfg.dataset, cfg.judge_protocol, cfg.scorer), wall_s=wall_s)


def run_eval(cfg: EvalConfig, rt: Runtime | None = None) -> dict:
    """Run every column through ``cfg.program`` and write the report files under ``cfg.out``.
    Raises ConfigError (a column named twice, a program that fails validation), FileNotFoundError.
    """
    from memgym.evolution.execution.validate import ValidationLimits, validate_program
    from memgym.rewards.scoring.report import write_eval_report

    t0 = time.time()
    source = read_program_source(cfg.program)
    # the cheap checks first (caches, data), then the program's validation, then the models
    rt = rt or cfg.runtime()
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
    main["run_card"] = run_card(cfg, rt, main["wall_s"])
    write_eval_report(main, Path(cfg.out))
    return main
