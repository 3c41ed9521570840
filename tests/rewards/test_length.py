"""Length penalty: exact values (docs/design.md § "Dense session reward and ADRPO", step 4) and token (never character) counting."""
from __future__ import annotations

import json

import pytest

from memgym.memory_bank.actions import parse_core
from memgym.rewards.length import core_length_penalty, core_written_text, count_tokens, part_length_penalty


@pytest.fixture(scope="module")
def policy_tokenizer():
    from transformers import AutoTokenizer

    from memgym.llm.models import prepare_smollm2_tokenizer

    return AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))


@pytest.mark.parametrize("n, lp", [(0, 0.0), (150, 0.0), (151, 0.004), (275, 0.5), (400, 1.0), (900, 1.0)])
def test_core_penalty_values(n, lp):
    assert core_length_penalty(n) == pytest.approx(lp)


@pytest.mark.parametrize("n, expert, lp", [
    (200, 1000, 1.0),     # r = 0.2: the low end of the ramp
    (500, 1000, 0.0),     # r = 0.5: inside the band (inclusive)
    (1300, 1000, 0.0),    # r = 1.3: inside the band (inclusive)
    (2000, 1000, 1.0),    # r = 2.0: the high end of the ramp
    (1650, 1000, 0.5),    # halfway up the high ramp: (1.65 - 1.3) / 0.7
    (350, 1000, 0.5),     # halfway down the low ramp: (0.5 - 0.35) / 0.3
    (100, 1000, 1.0),     # r = 0.1: clipped
    (3000, 1000, 1.0),    # r = 3.0: clipped
    (1000, 1000, 0.0),    # as long as the expert
])
def test_part_penalty_at_ratios(n, expert, lp):
    assert part_length_penalty(n, expert) == pytest.approx(lp)


def test_part_penalty_absolute_band_edges():
    # above the ratio band: |Δ| = 199 is forgiven, |Δ| = 200 is not (r = 1.8)
    assert part_length_penalty(449, 250) == 0.0
    assert part_length_penalty(450, 250) == pytest.approx((1.8 - 1.3) / 0.7)
    # below the band: |Δ| = 199 forgiven, |Δ| = 200 gives r = 1/3
    assert part_length_penalty(101, 300) == 0.0
    assert part_length_penalty(100, 300) == pytest.approx((0.5 - 1 / 3) / 0.3)


def test_part_penalty_empty_expert_and_bad_input():
    assert part_length_penalty(199, 0) == 0.0
    assert part_length_penalty(200, 0) == 1.0
    with pytest.raises(ValueError, match="n_tokens"):
        part_length_penalty(-1, 10)
    with pytest.raises(ValueError, match="token count"):
        part_length_penalty(3.5, 10)
    with pytest.raises(ValueError, match="r_min < band_lo"):
        part_length_penalty(10, 10, band_lo=0.1)
    with pytest.raises(ValueError, match="lo < hi"):
        core_length_penalty(10, lo=400, hi=150)


def test_core_written_text_choice():
    assert core_written_text(parse_core('{"operation": "APPEND", "content": "abc"}')) == "abc"
    assert core_written_text(parse_core('{"operation": "REWRITE", "content": "xyz"}')) == "xyz"
    assert core_written_text(parse_core('{"operation": "REPLACE", "old_text": "long old", "new_text": "n"}')) == "n"
    assert core_written_text(parse_core('{"operation": "NONE"}')) == ""
    with pytest.raises(TypeError):
        core_written_text({"operation": "NONE"})


def test_count_tokens_uses_the_tokenizer_not_characters(policy_tokenizer):
    text = "Jon - Career: former banker turned aspiring dance-studio owner | Details: lost his job."
    n = count_tokens(policy_tokenizer, [text, ""])
    assert n == [len(policy_tokenizer(text, add_special_tokens=False)["input_ids"]), 0]
    assert n[0] < len(text)  # tokens, not characters
    with pytest.raises(TypeError, match="texts\\[0\\]"):
        count_tokens(policy_tokenizer, [None])


def test_completion_as_long_as_expert_gets_zero_penalty(policy_tokenizer):
    """Public code counted the completion in tokens and the expert in characters, so an
    identical-length completion got r ≈ 0.3 and LP ≈ 0.65. Both must be tokens."""
    expert = json.dumps({"operations": [{"action": "ADD", "memory": f"2023-01-{d:02d}: event number {d} | Details: "
                                         f"Jon practised choreography with the crew for the festival"}
                                        for d in range(1, 13)]})
    (n_exp,) = count_tokens(policy_tokenizer, [expert])
    assert n_exp > 400 and len(expert) > 3 * n_exp  # long enough that the absolute band does not hide a bug
    assert part_length_penalty(n_exp, n_exp) == 0.0
    # what the character/token mix-up gave: r = tokens / characters ≈ 0.31, LP ≈ 0.65
    mixed = part_length_penalty(n_exp, len(expert))
    assert mixed == pytest.approx((0.5 - n_exp / len(expert)) / 0.3) and mixed > 0.5
