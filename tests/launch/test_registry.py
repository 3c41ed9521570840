"""The command registry and the settings sections: every shipped recipe parses through the
``memgym`` tree into its command's settings; no setting of eval, program eval or evolve is
declared in more than one class; unknown and renamed fields are one line naming them."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from memgym.launch.cli import build_parser, main as memgym
from memgym.launch.registry import parse
from memgym.llm.recipe import recipe_configs

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
    assert memgym(["evolve", "--budgets", "coder5"]) == 2  # the field type's own message, not argparse's
    assert capsys.readouterr().err.strip() == ("memgym evolve: --budgets 'coder5': expected role=tokens[,role=tokens...] "
                                               "(roles: coder, extract, plan, answer, extractor, judge)")


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


def test_every_entry_point_maps_parse_errors_to_one_line_and_exit_2(tmp_path, capsys):
    """``memgym train sft`` and ``python -m memgym.training.sft`` (what ``memgym launch`` runs in each
    process) parse with one parser: a value of the wrong type, from a flag or from the recipe, is
    one line and exit status 2 through either entry (argparse's own exit and usage text never)."""
    from memgym.training.sft import main as sft_main

    r = tmp_path / "r.yaml"
    r.write_text("max_steps: abc\n")
    for entry, prog in ((lambda argv: memgym(["train", "sft", *argv]), "memgym train sft"), (sft_main, "memgym train sft")):
        assert entry(["--max_steps", "abc"]) == 2
        assert capsys.readouterr().err.strip() == f"{prog}: argument --max_steps/--max-steps: invalid int value: 'abc'"
        assert entry(["--config", str(r)]) == 2
        assert capsys.readouterr().err.strip() == f"{prog}: recipe {r}: max_steps: invalid int value: 'abc'"
        assert entry(["--config", str(r), "--max_steps", "2", "--max_stepz", "3"]) == 2  # the flag replaced the value
        assert capsys.readouterr().err.strip() == (f"{prog}: unknown field(s): --max_stepz (did you mean --max_steps?); "
                                                   "--help lists every field")
        assert entry(["--config", str(tmp_path)]) == 1  # a folder: an OSError, exit 1 through both
        assert "Is a directory" in capsys.readouterr().err


def test_device_defaults_sit_between_the_recipe_and_the_flags(tmp_path, monkeypatch):
    """On a machine without CUDA the trainers' parser sets ``use_cpu true, bf16 false`` over the
    recipe's values; a flag overrides them."""
    import memgym.training.common as common

    monkeypatch.setattr(common, "cuda_available", lambda: False)
    r = tmp_path / "r.yaml"
    r.write_text("use_cpu: false\nbf16: true\nmax_steps: 4\n")
    args = parse(build_parser(), ["train", "sft", "--config", str(r)])
    assert (args.use_cpu, args.bf16, args.fp16, args.max_steps) == (True, False, False, 4)
    args = parse(build_parser(), ["train", "sft", "--config", str(r), "--bf16", "true", "--max_steps", "5"])
    assert (args.use_cpu, args.bf16, args.max_steps) == (True, True, 5)
    monkeypatch.setattr(common, "cuda_available", lambda: True)
    args = parse(build_parser(), ["train", "sft", "--config", str(r)])
    assert (args.use_cpu, args.bf16) == (False, True)


def test_recipe_values_are_converted_once_by_the_fields_types(tmp_path):
    """A recipe's text values reach the settings converted by their field's type (YAML reads
    ``1e-4`` as text); a recipe string for a bool field is read as one."""
    r = tmp_path / "r.yaml"
    r.write_text("learning_rate: 1e-4\nuse_peft: 'false'\nlora_r: '8'\n")
    _script, training, model = recipe_configs(parse(build_parser(), ["train", "sft", "--config", str(r)]))
    assert (training.learning_rate, model.use_peft, model.lora_r) == (1e-4, False, 8)


def test_evolve_experiment_is_its_own_recipe_command(tmp_path, capsys):
    args = parse(build_parser(), ["evolve", "experiment", "--config", str(REPO / "launch/recipes/demo_evolve.yaml"),
                                  "--variants", "full", "--seeds", "2"])
    assert (args.variants, args.seeds, args.func.__name__) == ("full", 2, "cmd_experiment")
    assert recipe_configs(args)[0].extractor == "turns"
    assert memgym(["evolve", "experiment", "--seeds", "0"]) == 2
    assert capsys.readouterr().err.strip() == ("memgym evolve experiment: argument --seeds: must be a positive "
                                               "integer, got '0'")
