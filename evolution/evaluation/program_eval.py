"""``memgym program eval``: validate one memory program, evaluate it with the stage-cached runner
(:func:`memgym.evolution.execution.runner.evaluate_program`, diagnostics included) and write
``report.json``, ``report.md``, ``tasks.jsonl`` and ``units.jsonl``. Scores in [0, 1] are
:func:`memgym.rewards.scoring.summary.summarise` of the run's questions; capability labels group
questions and never reach the program. The recipe is composed of the settings sections
(:mod:`memgym.evolution.execution.settings`) and is itself the runner's settings.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from memgym.data_synth.datasets import check_selection
from memgym.evolution.execution.results import ProgramEvaluation
from memgym.evolution.execution.runner import ProgramRunner, dump_units, evaluate_program
from memgym.evolution.execution.settings import OutputSection, ProgramSection, RunnerSettings
from memgym.evolution.execution.stage_cache import StageCache, open_stage_cache
from memgym.llm.errors import ConfigError
from memgym.llm.runtime import Runtime
from memgym.memory_bank.programs import read_program_source
from memgym.memory_bank.schema import CAPABILITY_NAMES
from memgym.rewards.scoring.selection import CapabilityLabels, QuestionSelection, load_selected


@dataclass
class ProgramEvalConfig(QuestionSelection, CapabilityLabels, RunnerSettings, OutputSection, ProgramSection):
    """A ``memgym program eval`` recipe: the data (:class:`QuestionSelection`), labels, models
    and runner sections (:class:`RunnerSettings`: the recipe is the runner's settings), the
    output section and the program, plus its parent and whether to validate it first. Every
    field can be overridden on the command line."""

    COMMAND_DEFAULTS = {"conversations": ["conv-26", "conv-30"], "out": "runs/program_eval"}

    parent: str | None = field(default=None, metadata={"help": "parent program, for the component diff"})
    validate: bool = field(default=True, metadata={"help": "run the 4 validation levels first"})

    def check(self) -> None:
        super().check()
        check_selection(self.dataset, self.path, self.conversations, self.split, self.scorer)


def _fmt(v) -> str:
    return "-" if v is None else f"{v:.3f}"


def _selection(rep: dict) -> str:
    """The conversations a report's run evaluated (``rep["conversations"]``, e.g. the valid split's),
    with the split named when the recipe chose one; older reports: the recipe's list."""
    cfg = rep["config"]
    ids = rep.get("conversations") or cfg.get("conversations") or []
    shown = ", ".join(ids[:12]) + (f", ... ({len(ids)} conversations)" if len(ids) > 12 else "")
    return f"split {cfg['split']}: {shown}" if cfg.get("split") else shown


def render_markdown(rep: dict) -> str:
    """``report.md``: scores and diagnostics by capability, the dataset's headline and the
    categories (the shared renderer, :mod:`memgym.rewards.scoring.report`), stages, cost."""
    from memgym.rewards.scoring.report import headline_table, protocol_lines, side_by_side

    diag = rep.get("diagnostics") or {}
    dcap = diag.get("by_capability", {})
    out = [f"# memgym program eval: `{rep['program']}`", "",
           f"- dataset: {rep['config']['dataset']} {_selection(rep)}; extraction: "
           f"`{rep['config']['extractor']}`; plan: {rep['config']['plan_mode']}",
           *protocol_lines({"scorer": rep["config"]["scorer"], "judge_protocol": rep.get("judge_protocol"),
                            "judge_calls": rep.get("judge_calls"),
                            "judge_note": (rep.get("summary") or {}).get("judge_note")}),
           f"- overall score: **{rep['overall']:.3f}** over {rep['n']} questions; wall {rep['wall_s']:.1f} s", "",
           "## By capability", "", "| capability | n | score | d_ext | d_idx | d_ret |", "|---|---|---|---|---|---|"]
    for k, v in rep["by_capability"].items():
        d = dcap.get(k, {})
        out.append(f"| {k} {CAPABILITY_NAMES.get(k, '')} | {v['n']} | {v['score']:.3f} | {_fmt(d.get('d_ext'))} | "
                   f"{_fmt(d.get('d_idx'))} | {_fmt(d.get('d_ret'))} |")
    if diag:
        o = diag["overall"]
        out.append(f"| **overall** | {rep['n']} | **{rep['overall']:.3f}** | {_fmt(o['d_ext'])} | {_fmt(o['d_idx'])} | "
                   f"{_fmt(o['d_ret'])} |")
        out += ["", f"Units: {diag['n_units']}, mean {_fmt(diag['mean_unit_chars'])} characters; retrieved: mean "
                    f"{_fmt(diag['mean_retrieved_chars'])} characters per question; tasks without resolvable "
                    f"evidence: {diag['n_no_evidence']}."]
    summ = {**(rep.get("summary") or {}), "by_category": rep["by_category"], "by_capability": rep["by_capability"]}
    col = [("program", summ)]
    ds = rep["config"]["dataset"] if rep.get("config") else summ.get("dataset")
    out += ["", f"## {ds} headline", "", *headline_table(ds, col), "",
            "## By category", "", side_by_side(summ, "by_category", col)]
    out += ["", "## Stages", "", "| stage | run | reused | LLM calls |", "|---|---|---|---|"]
    out += [f"| {s} | {c['run']} | {c['reused']} | {rep['stage_llm_calls'][s]} |" for s, c in rep["stage_items"].items()]
    if rep.get("reuse"):
        out += ["", f"Changed vs parent: {', '.join(rep['reuse']['changed']) or 'nothing'}; re-execution starts at "
                    f"`{rep['reuse']['start_stage']}`."]
    out += ["", "## Cost", "", f"- model calls per role: `{json.dumps(rep['model_calls'])}`",
            f"- tokens per role: `{json.dumps(rep['tokens'])}`",
            f"- extraction: `{json.dumps(rep['extraction'])}`; plan failures: {rep['plan_failures']}; "
            f"retrieve errors: {rep['retrieve_errors']}"]
    return "\n".join(out) + "\n"


def run_program_eval(cfg: ProgramEvalConfig, rt: Runtime | None = None,
                     cache: StageCache | None = None) -> ProgramEvaluation:
    """Validate and evaluate ``cfg.program``, write the report files; returns the
    :class:`ProgramEvaluation` (``ok`` False and no scores when validation fails). Raises
    FileNotFoundError, ValueError for a bad recipe, :class:`ProgramRunError` mid-run.
    """
    from memgym.evolution.execution.validate import ValidationLimits, validate_program

    t0 = time.time()
    if not cfg.program:
        raise ConfigError("give the program file: memgym program eval FILE.py --config R.yaml")
    prog = Path(cfg.program)
    if not prog.is_file():
        raise ConfigError(f"memory program not found: {prog}")
    source = read_program_source(prog)
    parent_source = None
    if cfg.parent:
        if not Path(cfg.parent).is_file():
            raise ConfigError(f"parent program not found: {cfg.parent}")
        parent_source = read_program_source(cfg.parent)
    out = Path(cfg.out)
    out.mkdir(parents=True, exist_ok=True)
    head = {"program": str(prog), "program_sha256": hashlib.sha256(source.encode()).hexdigest()[:16],
            "parent": cfg.parent, "config": asdict(cfg)}
    validation = None
    if cfg.validate:
        res = validate_program(source, None, ValidationLimits(), progress=cfg.progress)
        validation = res.to_dict()
        if not res.ok:
            ev = ProgramEvaluation(ok=False, validation=validation, wall_s=round(time.time() - t0, 2), **head)
            (out / "report.json").write_text(json.dumps(ev.to_dict(tasks=False), indent=2, ensure_ascii=False))
            (out / "report.md").write_text(f"# memgym program eval: `{prog}`\n\nValidation failed at level "
                                           f"{res.level}: {res.reason}\n")
            return ev
    rt = rt or cfg.runtime()
    own_cache = cache is None
    cache = cache if cache is not None else open_stage_cache(cfg.stage_cache)
    try:
        runner = ProgramRunner(rt, cfg, cache)
        convs = load_selected(cfg)
        ev, run = evaluate_program(source, convs, runner, parent_source=parent_source,
                                   diagnostics=cfg.diagnostics)
    finally:
        if own_cache:
            cache.close()
    for k, v in head.items():
        setattr(ev, k, v)
    ev.validation = validation
    ev.wall_s = round(time.time() - t0, 2)
    with open(out / "tasks.jsonl", "w", encoding="utf-8") as fh:
        for row in ev.tasks:
            fh.write(json.dumps(row, ensure_ascii=False) + "\n")
    dump_units(run, out / "units.jsonl")
    from memgym.llm.runcard import build_card, card_markdown
    from memgym.rewards.scoring.judge_protocols import protocol_card

    card = build_card(recipe=asdict(cfg), models=cfg.model_specs(), runtime=rt,
                      judge=protocol_card(cfg.dataset, cfg.judge_protocol, cfg.scorer),
                      cost={"calls": ev.model_calls, "tokens": ev.tokens}, wall_s=ev.wall_s)
    rep = {**ev.to_dict(tasks=False), "conversations": [c.id for c in convs], "run_card": card}  # what ran
    (out / "report.json").write_text(json.dumps(rep, indent=2, ensure_ascii=False, default=str))
    (out / "report.md").write_text(render_markdown(rep) + "\n".join(["", *card_markdown(card, str(out / "report.json"))]))
    return ev
