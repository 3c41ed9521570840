"""What a new user hits: bad values rejected at parse time, one-line errors instead of
tracebacks, and no data loss (issue 12, findings 1, 2, 3, 5, 6)."""
from __future__ import annotations

import json
import sys

import pytest

from memgym.launch.cli import main as memgym, passive_openmp
from memgym.llm.errors import ConfigError, OutputPathError
from memgym.evolution.evaluation.eval_job import EvalConfig


def test_models_prepare_refuses_a_folder_holding_a_file(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    (out / "sub").mkdir()
    for extra in ([], ["--force"]):
        assert memgym(["models", "prepare", "--out", str(out), *extra]) == 2
        err = capsys.readouterr().err
        assert "not a memgym model folder" in err and "left untouched" in err and "Traceback" not in err
    assert (out / "thesis.tex").read_text() == "years of work" and (out / "sub").is_dir()
    f = tmp_path / "file.bin"
    f.write_text("x")
    assert memgym(["models", "prepare", "--out", str(f)]) == 2
    assert "is an existing file" in capsys.readouterr().err and f.read_text() == "x"


@pytest.mark.parametrize("argv,needle", [
    (["--max_questions", "-1"], "--max_questions: must be >= 1, got -1"),
    (["--max_questions", "0"], "--max_questions: must be >= 1, got 0"),
    (["--n_sessions", "0"], "--n_sessions: must be >= 1, got 0"),
    (["--answer_max_new_tokens", "0"], "--answer_max_new_tokens: must be >= 1, got 0"),
    (["--batch_size", "0"], "--batch_size: must be >= 1, got 0"),
    (["--scorer", "llm"], "--scorer llm needs --judge_model"),
    (["--compare", "expert:"], "expert: needs a trajectory file"),
    (["--judge_model", "openai:http://x/v1"], "must name a model after '#'"),
    (["--extractor", "hf:smolm2"], "did you mean hf:smollm2?"),
])
def test_eval_rejects_bad_values_before_loading_anything(argv, needle, capsys, tmp_path):
    assert memgym(["eval", "--out", str(tmp_path / "o"), *argv]) == 2
    err = capsys.readouterr().err
    assert needle in err and "Traceback" not in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "o").exists()


def test_program_eval_rejects_zero_sessions_and_bad_timeouts(capsys, tmp_path):
    prog = tmp_path / "p.py"
    prog.write_text("x = 1\n")
    for argv, needle in ((["--n_sessions", "0"], "--n_sessions: must be >= 1, got 0"),
                         (["--call_timeout_s", "-1"], "--call_timeout_s: must be >= 0.001, got -1.0"),
                         (["--scorer", "llm"], "--scorer llm needs --judge_model")):
        assert memgym(["program", "eval", str(prog), *argv]) == 2
        assert needle in capsys.readouterr().err


def test_yaml_string_becomes_a_one_element_list(tmp_path):
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig
    from memgym.launch.cli import build_parser
    from memgym.launch.registry import parse
    from memgym.llm.recipe import recipe_configs

    r = tmp_path / "r.yaml"
    r.write_text("conversations: conv-30\ncompare: expert:conv-30\n")
    (cfg,) = recipe_configs(parse(build_parser(), ["eval", "--recipe", str(r)]))
    assert cfg.conversations == ["conv-30"] and cfg.compare == ["expert:conv-30"]
    assert ProgramEvalConfig(conversations="conv-41").conversations == ["conv-41"]


def test_out_that_is_a_file_fails_at_parse_time(tmp_path):
    f = tmp_path / "report"
    f.write_text("old results")
    with pytest.raises(OutputPathError, match="--out .* is an existing file"):
        EvalConfig(out=str(f))
    assert f.read_text() == "old results"


@pytest.mark.parametrize("recipe,needle", [
    ("batch_size: null\n", "batch_size: int expected, got null"),  # top_k is the program's now
    ("dataset: [locomo\n", "broken YAML"),
])
def test_bad_recipes_are_one_line(recipe, needle, tmp_path, capsys):
    r = tmp_path / "r.yaml"
    r.write_text(recipe)
    rc = memgym(["eval", "--recipe", str(r)])
    err = capsys.readouterr().err
    assert rc == 2 and needle in err and len(err.strip().splitlines()) == 1


def test_recipe_folder_or_missing_value_is_one_line(tmp_path, capsys):
    assert memgym(["eval", "--recipe", str(tmp_path)]) == 1
    assert "Is a directory" in capsys.readouterr().err
    assert memgym(["eval", "--recipe"]) == 2  # argparse's own errors are ConfigErrors too: one line, exit 2
    assert capsys.readouterr().err.strip() == "memgym eval: argument --config/--recipe: expected one argument"


def test_debug_keeps_the_traceback(tmp_path, monkeypatch):
    r = tmp_path / "r.yaml"
    r.write_text("dataset: [locomo\n")
    import yaml
    monkeypatch.setenv("MEMGYM_DEBUG", "1")
    with pytest.raises(ConfigError, match=f"recipe {r}: broken YAML: while parsing a flow sequence") as e:
        memgym(["eval", "--recipe", str(r)])
    assert isinstance(e.value.__cause__, yaml.YAMLError)  # the traceback keeps the parser's error


def test_a_bad_recipe_value_names_the_recipe_and_the_key(tmp_path, capsys):
    r = tmp_path / "r.yaml"
    r.write_text("rounds_refine: six\n")
    assert memgym(["evolve", "--config", str(r)]) == 2
    assert capsys.readouterr().err.strip() == f"memgym evolve: recipe {r}: rounds_refine: invalid int value: 'six'"
    r.write_text("dataset: [locomo\n")
    assert memgym(["evolve", "--config", str(r)]) == 2
    assert capsys.readouterr().err.startswith(f"memgym evolve: recipe {r}: broken YAML: ")


@pytest.mark.parametrize("command", [["evolve"], ["eval"], ["program", "eval", "memory_bank/programs/bm25.py"]])
def test_debug_shows_the_traceback_of_recipe_errors(command, tmp_path, capsys):
    """A missing recipe is a usage error: one line and exit 2, mapped in one place
    (:func:`memgym.launch.cli.run_command`); ``memgym --debug`` re-raises it with its traceback."""
    missing = str(tmp_path / "nope.yaml")
    assert memgym([*command, "--config", missing]) == 2
    plain = capsys.readouterr().err
    assert "Traceback" not in plain and plain.strip() == f"memgym {' '.join(command[:2 if command[0] == 'program' else 1])}: recipe {missing} not found"
    with pytest.raises(ConfigError, match="not found"):
        memgym(["--debug", *command, "--config", missing])
    import os
    assert "MEMGYM_DEBUG" not in os.environ  # --debug does not leak into later commands


def test_genuine_bugs_keep_their_traceback():
    from memgym.launch.cli import run_command

    class Args:
        debug = False

        @staticmethod
        def func(_):
            raise ZeroDivisionError("a bug")

    with pytest.raises(ZeroDivisionError):
        run_command(Args(), "x")


def test_config_errors_are_config_errors():
    with pytest.raises(ConfigError):
        EvalConfig(batch_size=0)


@pytest.mark.parametrize("argv", [
    ["synth", "qa", "--n-sessions", "0"], ["synth", "qa", "--n-sessions", "-1"], ["synth", "qa", "--j", "0"],
    ["synth", "trajectories", "--expert", "hf:smollm2", "--max-tries", "0"],
    ["reward", "audit", "--trajectories", "x.jsonl", "--batch-size", "0"],
])
def test_argparse_counts_are_checked_at_parse_time(argv, capsys):
    with pytest.raises(SystemExit) as e:
        memgym([*argv, "--out", "never.jsonl"] if argv[0] == "synth" else argv)
    assert e.value.code == 2 and "must be >= 1" in capsys.readouterr().err


def test_synth_qa_help_has_no_literal_double_percent(capsys):
    with pytest.raises(SystemExit):
        memgym(["synth", "qa", "--help"])
    out = capsys.readouterr().out
    assert "%%" not in out and "20% temporal" in " ".join(out.split())


def test_audit_with_a_qa_file_matching_nothing_says_so(tmp_path, capsys):
    from memgym.data_synth.paths import expert_dir

    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"conversation_id": "conv-99", "session": 1, "qa": []}) + "\n")
    rc = memgym(["reward", "audit", "--trajectories", str(expert_dir() / "conv-30.jsonl"), "--qa", str(qa),
                 "--embedder", "hash:256", "--quiet"])
    err = capsys.readouterr().err
    assert rc == 2 and f"QA file {qa}: no QA for any of the" in err and "no samples" not in err


def test_serve_on_a_busy_port_is_one_line_before_loading(capsys):
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        rc = memgym(["serve", "--model", "hf:smollm2", "--engine", "builtin", "--port", str(port)])
    err = capsys.readouterr().err
    assert rc == 1 and f"cannot listen on 127.0.0.1:{port} (Address already in use)" in err and err.startswith("memgym serve: ") and len(err.strip().splitlines()) == 1
    with pytest.raises(SystemExit):
        memgym(["serve", "--model", "hf:smollm2", "--port", "70000"])
    assert "must be in [0, 65535]" in capsys.readouterr().err


def test_bank_replay_out_dir_is_refused_before_replaying(tmp_path, capsys):
    from memgym.data_synth.paths import expert_dir

    assert memgym(["bank", "replay", str(expert_dir() / "conv-30.jsonl"), "--out", str(tmp_path)]) == 2
    assert "is a directory; give a file path" in capsys.readouterr().err


def test_training_configs_share_the_checks(tmp_path):
    from memgym.rewards.reward_types import SessionRewardConfig
    from memgym.training.adrpo_config import ADRPOConfigError, ADRPOScriptArguments, check_recipe
    from memgym.training.sft import SFTScriptArguments

    assert SFTScriptArguments(train_trajectories="a.jsonl", eval_trajectories="b.jsonl").eval_trajectories == ["b.jsonl"]
    with pytest.raises(ConfigError, match="--max_examples: must be >= 1, got 0"):
        SFTScriptArguments(max_examples=0)
    assert ADRPOScriptArguments(train_trajectories="conv-26").train_trajectories == ["conv-26"]
    with pytest.raises(ADRPOConfigError, match="--judge f1 needs --answer_model"):
        check_recipe(ADRPOScriptArguments(), SessionRewardConfig(judge="f1"))
    with pytest.raises(ADRPOConfigError, match="--judge llm needs --judge_model"):
        check_recipe(ADRPOScriptArguments(answer_model="hf:smollm2"), SessionRewardConfig(judge="llm"))


def test_eval_dead_server_and_broken_data_are_one_line(tmp_path, capsys):
    dead = "openai:http://127.0.0.1:1/v1#m"
    rc = memgym(["eval", "--extractor", dead, "--task_model", dead, "--conversations", "conv-30", "--n_sessions", "1",
                 "--request_retries", "0", "--cache", "none", "--no_progress", "--out", str(tmp_path / "a")])
    err = capsys.readouterr().err
    last = err.strip().splitlines()[-1]  # (the embedder's load bar may come before it)
    assert rc == 1 and last.startswith("memgym eval: OpenAIBackend: request to http://127.0.0.1:1/v1")
    assert "Traceback" not in err
    bad = tmp_path / "locomo.json"
    bad.write_text('[{"sample_id": "conv-30"}]')
    rc = memgym(["eval", "--path", str(bad), "--extractor", "expert:conv-30", "--out", str(tmp_path / "b")])
    err = capsys.readouterr().err
    assert rc == 1 and f"file {bad}" in err and "Traceback" not in err


@pytest.mark.parametrize("argv", [["eval", "--help"], ["program", "eval", "--help"]])
def test_help_reads_right_for_progress_and_path(argv, capsys):
    with pytest.raises(SystemExit):
        memgym(argv)
    out = " ".join(capsys.readouterr().out.split())
    assert "show progress bars (default: False)" not in out  # --no_progress read backwards
    assert "progress bars: on (true) or off (--no_progress)" in out
    path_help = out.rsplit("--path PATH", 1)[1].split("--", 1)[0]  # the options entry, not the usage line
    assert path_help.count("default") == 1, path_help


def test_user_errors_share_one_base_whose_kind_sets_the_exit_status():
    from memgym.data_synth.annotate import LabelValidationError
    from memgym.data_synth.errors import DataFormatError
    from memgym.data_synth.expert import TrajectoryError
    from memgym.data_synth.jsonl import JsonlCorruptError, JsonlLockedError
    from memgym.data_synth.qa_format import SessionQAError
    from memgym.launch.cmd_launch import LaunchError
    from memgym.launch.cmd_synth import UsageError
    from memgym.llm.errors import exit_status
    from memgym.llm.base import BackendSpecError, BatchError, LLMError, TruncatedOutputError
    from memgym.llm.cache import CacheCorruptError
    from memgym.llm.errors import MemgymError, OutputPathError
    from memgym.llm.models import ModelPackageMissing
    from memgym.memory_bank.errors import BankFormatError, OutputTruncatedError
    from memgym.rewards.session_reward import RewardDataError
    from memgym.training.adrpo_config import ADRPOConfigError
    from memgym.training.adrpo_data import ADRPODataError
    from memgym.training.sft_data import ExampleLengthError, TrainingDataError

    usage = (ConfigError, OutputPathError, LaunchError, UsageError, ADRPOConfigError)
    run = (LLMError, BackendSpecError, TruncatedOutputError, CacheCorruptError, BatchError, ModelPackageMissing,
           BankFormatError, OutputTruncatedError, DataFormatError, TrajectoryError, JsonlCorruptError,
           JsonlLockedError, SessionQAError, LabelValidationError, RewardDataError, ADRPODataError,
           TrainingDataError, ExampleLengthError)
    for cls in usage + run:
        assert issubclass(cls, MemgymError), cls
        exc = cls.__new__(cls)  # some take structured arguments (DataFormatError(source, record, field, ...))
        assert exit_status(exc) == (2 if cls in usage else 1), cls
    assert issubclass(ConfigError, ValueError) and issubclass(LLMError, RuntimeError)  # stdlib bases kept
    assert exit_status(FileNotFoundError("x")) == 1 and exit_status(KeyError("bug")) is None


def test_passive_openmp_only_for_embedding_commands_and_never_over_the_user(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    monkeypatch.delitem(sys.modules, "torch", raising=False)  # as in a fresh `memgym` process
    assert passive_openmp("train") is False and "OMP_WAIT_POLICY" not in __import__("os").environ
    assert passive_openmp("program") is True and __import__("os").environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    assert passive_openmp("evolve") is False and __import__("os").environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_command_errors_reach_the_one_mapping(tmp_path, monkeypatch):
    """bank replay, synth, reward audit and data stats raise their errors (usage errors, exit 2,
    mapped by :func:`memgym.launch.cli.run_command` alone): ``--debug`` shows their traceback."""
    from memgym.data_synth.paths import expert_dir
    from memgym.launch.cmd_synth import UsageError

    monkeypatch.setenv("MEMGYM_DEBUG", "1")
    with pytest.raises(ConfigError, match="is a directory; give a file path"):
        memgym(["bank", "replay", str(expert_dir() / "conv-30.jsonl"), "--out", str(tmp_path)])
    with pytest.raises(UsageError, match="name the conversations with --conversations"):
        memgym(["synth", "qa", "--out", str(tmp_path / "q.jsonl")])
    qa = tmp_path / "qa.jsonl"
    qa.write_text(json.dumps({"conversation_id": "conv-99", "session": 1, "qa": []}) + "\n")
    with pytest.raises(ConfigError, match=f"QA file {qa}: no QA for any of the"):
        memgym(["reward", "audit", "--trajectories", str(expert_dir() / "conv-30.jsonl"), "--qa", str(qa),
                "--embedder", "hash:256", "--quiet"])
    with pytest.raises(ConfigError, match="error: "):
        memgym(["data", "stats", "--dataset", "locomo", "--path", str(tmp_path / "none.json")])
