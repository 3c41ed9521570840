"""Tests of :mod:`memgym.memory_bank.actions`."""
from __future__ import annotations

import pytest

from memgym.llm.base import Completion, TruncatedOutputError, require_complete
from memgym.memory_bank.actions import parse_core, parse_part, unterminated_json
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.errors import OutputTruncatedError
from tests.helpers import CUT




@pytest.mark.parametrize("text,where", [
    (CUT, "string"),
    ('{"operations": [{"action": "ADD", "memory": "a"}, {"action": "ADD"', "object"),
    ('{"operations": [{"action": "ADD", "memory": "a"},', "array"),
    ('{"operation": "REWRITE", "content": "x \\" still inside', "string"),
])
def test_unterminated_json_is_truncated_with_bank_untouched(text, where):
    assert unterminated_json(text) == where
    bank = MemoryBank()
    bank.apply_text("episodic", '{"operations": [{"action": "ADD", "memory": "kept"}]}', 1)
    before = bank.dumps()
    manager = "core" if '"operation"' in text else "episodic"
    with pytest.raises(OutputTruncatedError) as e:
        bank.apply_text(manager, text, 2)
    assert e.value.error_type == "truncated" and isinstance(e.value, TruncatedOutputError)
    assert bank.dumps() == before


def test_small_damage_fences_and_prose_are_still_repaired():
    assert unterminated_json('Sure: {"a": [1, 2]} and a {brace} in prose.') is None
    assert unterminated_json('Here [is] it: {"operations": []} (I used [brackets') is None  # prose around it
    assert unterminated_json('Here [is] it: {"operations": [') == "array"
    assert parse_core('```json\n{"operation": "NONE"}\n```').operation == "NONE"
    ops = parse_part('{"operations": [{"action": "ADD", "memory": "x"},]}', "episodic")  # trailing comma
    assert [o.memory for o in ops] == ["x"]
    ops = parse_part("{'operations': [{'action': 'ADD', 'memory': 'it is'}]}", "semantic")  # single quotes
    assert [o.memory for o in ops] == ["it is"]
    # a closer that skips one level is damage, not a cut
    assert unterminated_json('{"operations": [{"action": "ADD", "memory": "x"]}') is None


def test_finish_reason_length_fails_even_when_the_text_parses():
    whole = '{"operation": "REWRITE", "content": "short"}'
    assert parse_core(whole, "stop").operation == "REWRITE"
    with pytest.raises(OutputTruncatedError, match="token limit"):
        parse_core(whole, "length")
    with pytest.raises(TruncatedOutputError, match="plan was cut off .* after 7 tokens"):
        require_complete(Completion("x", completion_tokens=7, finish_reason="length"), "plan")
    assert require_complete(Completion("x")) == "x"
