"""A mistyped field is one line naming its closest field (:mod:`memgym.llm.recipe`)."""
from __future__ import annotations

from memgym.launch.cli import main


def test_a_flag_typo_names_the_closest_field(capsys):
    rc = main(["eval", "--config", "launch/recipes/demo_locomo.yaml", "--max_qestions", "3"])
    err = capsys.readouterr().err.strip().splitlines()
    assert rc == 2 and err == ["memgym eval: unknown field(s): --max_qestions (did you mean --max_questions?); "
                               "--help lists every field"]
