"""A mistyped field is one line naming its closest field (:mod:`memgym.llm.recipe`)."""
from __future__ import annotations

import pytest

from memgym.launch.cli import main


def test_a_flag_typo_names_the_closest_field(capsys):
    rc = main(["eval", "--config", "launch/recipes/demo_locomo.yaml", "--max_qestions", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["memgym eval: unknown field(s): --max_qestions (did you mean --max_questions?); "
                               "--help lists every field"]


def _recipe(tmp_path, text, name="r.yaml"):
    r = tmp_path / name
    r.write_bytes(text if isinstance(text, bytes) else text.encode())
    return str(r)


def test_a_recipe_that_is_not_utf8_is_one_line(tmp_path, capsys):
    r = _recipe(tmp_path, b"n_sessions: \xff\n")
    assert main(["eval", "--config", r, "--out", str(tmp_path / "out")]) == 2
    assert capsys.readouterr().err.strip() == f"memgym eval: recipe {r}: not UTF-8 text (byte 12: invalid start byte)"
    assert not (tmp_path / "out").exists()


def test_a_key_given_twice_in_a_recipe_is_refused(tmp_path):
    from memgym.launch.cmd_eval import make_parser
    from memgym.llm.errors import ConfigError

    r = _recipe(tmp_path, "n_sessions: 3\nn_sessions: 4\n")
    with pytest.raises(ConfigError, match=r"broken YAML: duplicate key 'n_sessions' .* line 2, column 1"):
        make_parser("memgym eval").parse(["--config", r])


def test_recipe_values_of_a_shape_the_field_cannot_take_name_the_key(tmp_path):
    """null for a field that takes no null, a list for a value, a mapping for a list: the
    recipe and key are named before any dataclass or trainer sees the value."""
    from memgym.launch.cmd_evolve import make_parser as evolve_parser
    from memgym.launch.cmd_train import stage_parser
    from memgym.llm.errors import ConfigError

    sft = stage_parser("sft", "memgym train sft")
    for text, needle in (("learning_rate: null\n", "learning_rate: float expected, got null"),
                         ("lora_target_modules: {q_proj: 1}\n", "lora_target_modules: list expected, got {'q_proj': 1}"),
                         ("max_examples: [4]\n", "max_examples: int expected, got [4]")):
        r = _recipe(tmp_path, text)
        with pytest.raises(ConfigError) as e:
            stage_parser("sft", "memgym train sft").parse(["--config", r])
        assert str(e.value) == f"recipe {r}: {needle}"
    r = _recipe(tmp_path, "train: {conv-26: 1}\n")
    with pytest.raises(ConfigError) as e:
        evolve_parser("memgym evolve").parse(["--config", r])
    assert str(e.value) == f"recipe {r}: train: list expected, got {{'conv-26': 1}}"
    assert sft.parse(["--config", _recipe(tmp_path, "report_to: [none]\nlora_target_modules: q_proj\n")]).report_to == ["none"]


def test_a_recipe_value_outside_the_fields_choices_is_refused(tmp_path):
    from memgym.launch.cmd_train import stage_parser
    from memgym.llm.errors import ConfigError

    r = _recipe(tmp_path, "lr_scheduler_type: bogus\n")
    with pytest.raises(ConfigError, match=rf"^recipe {r}: lr_scheduler_type: invalid choice: 'bogus' \(choose from linear, "):
        stage_parser("sft", "memgym train sft").parse(["--config", r])
    assert stage_parser("sft", "x").parse(["--config", r, "--lr_scheduler_type", "cosine"]).lr_scheduler_type == "cosine"


def test_a_last_flag_without_value_is_named_as_the_flag_and_a_stray_word_as_a_word(capsys):
    argv = ["eval", "--config", "launch/recipes/demo_locomo.yaml", "--n_sessions"]
    assert main(argv) == 2
    assert capsys.readouterr().err.strip() == "memgym eval: argument --n_sessions/--n-sessions: expected one argument"
    assert main(["eval", "--config", "launch/recipes/demo_locomo.yaml", "stray"]) == 2
    assert capsys.readouterr().err.strip() == ("memgym eval: unexpected argument(s): stray "
                                               "(a field is given as --field value)")


def test_recipe_numbers_and_bools_are_converted_by_the_fields_type_as_flags_are(tmp_path):
    """YAML reads ``2.5``, ``true`` and ``1`` as a number or bool; the field's type converts
    them as it converts a flag's text, so ``rounds_cold: 2.5`` fails and ``use_peft: 1`` is True."""
    from memgym.launch.cmd_evolve import make_parser as evolve_parser
    from memgym.launch.cmd_train import stage_parser
    from memgym.llm.errors import ConfigError

    for text, needle in (("rounds_cold: 2.5\n", "rounds_cold: invalid int value: '2.5'"),
                         ("rounds_cold: true\n", "rounds_cold: invalid int value: 'True'")):
        r = _recipe(tmp_path, text)
        with pytest.raises(ConfigError) as e:
            evolve_parser("memgym evolve").parse(["--config", r])
        assert str(e.value) == f"recipe {r}: {needle}"
    r = _recipe(tmp_path, "use_peft: 1\nbf16: no\nlearning_rate: 2\nlora_r: 8\n")
    args = stage_parser("sft", "memgym train sft").parse(["--config", r])
    assert (args.use_peft, args.bf16, args.learning_rate, args.lora_r) == (True, False, 2.0, 8)
    assert type(args.learning_rate) is float
