"""The command registry and the settings sections: every shipped recipe parses through the
``memgym`` tree into its command's settings; no setting of eval, program eval or evolve is
declared in more than one class; unknown and renamed fields are one line naming them."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memgym.launch.cli import build_parser, main as memgym
from memgym.launch.registry import parse, recipe_configs

REPO = Path(__file__).resolve().parents[2]
RECIPES = sorted((REPO / "launch" / "recipes").glob("*.yaml")) + sorted((REPO / "scripts").rglob("*.yaml"))


def command_of(recipe: Path) -> list[str]:
    """The command a shipped recipe is written for (its file name says it)."""
    n = recipe.stem
    if "evolve" in n or n.startswith("experiment"):
        return ["evolve", "experiment"] if n.startswith("experiment") else ["evolve"]
    if n.startswith("program"):
        return ["program", "eval"]
    if "sft" in n:
        return ["train", "sft"]
    if "adrpo" in n:
        return ["train", "adrpo"]
    return ["eval"]


def declared_in(cls) -> dict[str, list[str]]:
    """field name -> the classes of ``cls.__mro__`` whose own annotations declare it."""
    out: dict[str, list[str]] = {}
    for k in cls.__mro__:
        for name in k.__dict__.get("__annotations__", {}):
            if name in {f.name for f in dataclasses.fields(cls)}:
                out.setdefault(name, []).append(k.__name__)
    return out


def test_no_setting_is_declared_twice():
    from memgym.evolution.evaluation.eval_job import EvalConfig
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig
    from memgym.evolution.search.config import EvolveConfig

    configs = (EvolveConfig, ProgramEvalConfig, EvalConfig)
    for cls in configs:
        twice = {n: c for n, c in declared_in(cls).items() if len(c) > 1}
        assert not twice, f"{cls.__name__}: {twice}"
    # a setting two commands share comes from one section class
    owners = {}
    for cls in configs:
        for name, classes in declared_in(cls).items():
            owners.setdefault(name, set()).update(classes)
    assert {n: o for n, o in owners.items() if len(o) > 1} == {}
    shared = set(dataclasses.fields(EvolveConfig)) & set(dataclasses.fields(ProgramEvalConfig))
    assert {f.name for f in shared} >= {"extractor", "task_model", "judge_model", "scorer", "workers", "cache",
                                        "context_tokens", "out", "stage_cache", "dataset", "labels"}
    assert {n: c for n, c in declared_in(EvalConfig).items() if c == ["EvalConfig"]} == {"compare": ["EvalConfig"]}
    assert {f.name for f in dataclasses.fields(EvalConfig)} >= {"program", "task_model", "extractor", "constrained",
                                                                "scorer", "out", "stage_cache", "conversations"}


def test_eval_defaults_and_columns():
    from memgym.evolution.evaluation.eval_job import EvalConfig, column_settings
    from memgym.memory_bank.programs import bank_program_path

    cfg = EvalConfig(compare=["hf:smollm2 constrained", "expert:conv-30"], constrained_max_chars=160)
    assert (cfg.extractor, cfg.task_model, cfg.plan_mode, cfg.scorer, cfg.out, cfg.program, cfg.conversations) == \
        ("hf:smollm2", "hf:smollm2", "question", "f1", "runs/eval", str(bank_program_path()), ["conv-30"])
    settings, label = column_settings(cfg, "hf:smollm2 constrained")
    assert (settings.extractor, settings.constrained, label) == ("hf:smollm2", True, "hf:smollm2 (constrained)")
    assert dataclasses.replace(settings, extractor=cfg.extractor, constrained=cfg.constrained) == cfg
    assert column_settings(cfg, "expert:conv-30")[0].constrained is False


#: recipes whose values name what another command produces: given here so the rest is parsed
PRODUCED = {"program_trained_locomo.yaml": ["--extractor", "hf:smollm2"]}  # its extractor is make train-cpu's


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.name)
def test_every_shipped_recipe_parses(recipe):
    args = parse(build_parser(), [*command_of(recipe), "--config", str(recipe), *PRODUCED.get(recipe.name, [])])
    configs = recipe_configs(args)
    assert configs and all(dataclasses.is_dataclass(c) for c in configs)


def test_evolve_recipe_values_reach_the_runner_unchanged():
    (cfg,) = recipe_configs(parse(build_parser(), ["evolve", "--config", str(REPO / "launch/recipes/demo_evolve.yaml"),
                                                   "--budgets", "coder=5,judge=7", "--out", "/tmp/x_evolve"]))
    assert (cfg.extractor, cfg.plan_mode, cfg.context_tokens, cfg.answer_tokens) == ("turns", "question", 1024, 48)
    assert cfg.budgets == {"coder": 5, "judge": 7} and cfg.role_budgets()["plan"] is None
    coder = recipe_configs(parse(build_parser(), ["evolve", "--config",
                                                  str(REPO / "launch/recipes/evolve_locomo_coder.yaml")]))[0]
    assert coder.budgets == {"coder": 2000000}


def test_old_and_unknown_fields_are_one_line_naming_them(tmp_path, capsys):
    r = tmp_path / "r.yaml"
    r.write_text("dataset: locomo\nbudget_coder: 5\nrounds_cld: 2\n")
    assert memgym(["evolve", "--config", str(r)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "budget_coder (now budgets)" in err and "rounds_cld (did you mean rounds_cold?)" in err
    assert memgym(["evolve", "--budget_judge", "5"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "memgym evolve: unknown field(s): --budget_judge (now --budgets); --help lists every field"
    assert memgym(["evolve", "--budgets", "coders=5"]) == 2
    assert "--budgets: unknown role 'coders'" in capsys.readouterr().err


def test_eval_answer_model_is_named_as_task_model(tmp_path, capsys):
    r = tmp_path / "r.yaml"
    r.write_text("dataset: locomo\nanswer_model: hf:smollm2\n")
    assert memgym(["eval", "--config", str(r)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == (f"memgym eval: recipe {r}: unknown field(s): answer_model (now task_model); --help lists every "
                   "field")
    assert memgym(["eval", "--answer_model", "hf:smollm2"]) == 2
    assert capsys.readouterr().err.strip() == ("memgym eval: unknown field(s): --answer_model (now --task_model); "
                                               "--help lists every field")


def test_resume_takes_no_recipe_fields(tmp_path, capsys):
    assert memgym(["evolve", "--resume", str(tmp_path), "--rounds_cold", "3"]) == 2
    assert "--resume takes no other arguments than --no_progress" in capsys.readouterr().err
    assert memgym(["evolve", "--resume", str(tmp_path)]) == 2
    assert "no run to resume" in capsys.readouterr().err


@pytest.mark.parametrize("command", [["evolve"], ["evolve", "experiment"], ["program", "eval"], ["eval"],
                                     ["train", "sft"], ["train", "adrpo"]])
def test_help_lists_the_recipe_fields(command, capsys):
    with pytest.raises(SystemExit) as e:
        memgym([*command, "--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: memgym {' '.join(command)}") and "--config R.yaml, --recipe R.yaml" in out
