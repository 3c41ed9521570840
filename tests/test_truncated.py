"""Cut-off outputs are format failures of type ``truncated`` everywhere: manager-output parsing,
``memgym bank check``, memory construction (``memgym eval``), the session reward (ADRPO) and the
program runner. Base code applied the repaired half-output as valid memory."""
from __future__ import annotations

import dataclasses
import json
from datetime import datetime

import pytest

from launch.cmd_bank import check_output
from llm.base import Completion, GenerationParams, TruncatedOutputError, require_complete
from memory_bank.actions import parse_core, parse_part, unterminated_json
from memory_bank.bank import MemoryBank
from memory_bank.construct import ModelExtractor, construct
from memory_bank.errors import OutputTruncatedError
from memory_bank.schema import Conversation, Session, Turn
from tests.helpers import ScriptedBackend

CUT = '{"operations": [{"action": "ADD", "memory": "2023-05-08: Went to the'


class LengthMarked:
    """A Backend whose completions finish with ``finish_reason="length"`` when ``cut(messages)``."""

    def __init__(self, inner: ScriptedBackend, cut):
        self.inner, self.cut = inner, cut
        self.model_id = inner.model_id

    @property
    def calls(self):
        return self.inner.calls

    def generate(self, batch, params):
        out = self.inner.generate(batch, params)
        return [dataclasses.replace(c, finish_reason="length") if self.cut(m) else c for m, c in zip(batch, out)]


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


def test_bank_check_reports_truncated():
    v = check_output("episodic", CUT.encode())
    assert (v["ok"], v["error"]) == (False, "truncated") and "unterminated string" in v["message"]
    v = check_output("core", b'{"operation": "REWRITE", "content": "short"}', finish_reason="length")
    assert (v["ok"], v["error"]) == (False, "truncated")
    assert check_output("core", b'{"operation": "REWRITE", "content": "short"}')["ok"] is True


def _conv() -> Conversation:
    s = Session(1, "s1", datetime(2023, 5, 8), "8 May 2023", (Turn("D1:1", "A", "I went to the park"),))
    return Conversation("c", ("A", "B"), (s,), ())


def test_construction_counts_a_cut_off_rewrite_as_truncated_and_keeps_the_core():
    """The eval path (memory construction with a model extractor): a REWRITE that stopped on the
    token limit would shrink the core block to a fragment; it is a failure and the core stays."""
    from memory_bank.prompts import SYSTEM_PROMPTS

    def is_core(messages):
        return messages[0]["content"] == SYSTEM_PROMPTS["core"]

    def respond(messages, params):
        return '{"operation": "REWRITE", "content": "A is"}' if is_core(messages) else '{"operations": []}'

    backend = LengthMarked(ScriptedBackend(respond), cut=is_core)
    bank = MemoryBank()
    bank.apply_text("core", json.dumps({"operation": "APPEND", "content": "A lives in Paris and works as a nurse."}), 0)
    res = construct(_conv(), ModelExtractor(backend, GenerationParams(max_new_tokens=50)), bank=bank)
    assert [(f.manager, f.error_type) for f in res.failures] == [("core", "truncated")]
    assert res.bank.core == "A lives in Paris and works as a nurse."


def test_session_reward_gates_truncated_completions():
    from rewards.samples import RewardSample, sample_key
    from rewards.session_reward import SessionReward, SessionRewardConfig
    from memory_bank.schema import QAItem
    from llm.embeddings import HashEmbedder

    class WordTok:
        def __call__(self, texts, add_special_tokens=False):
            return {"input_ids": [t.split() for t in texts]}

    empty = {"core": '{"operation": "NONE"}', "episodic": '{"operations": []}', "semantic": '{"operations": []}',
             "procedural": '{"operations": []}'}
    q = QAItem("q", "Where did A go?", "park", ("D1:1",), "single-session")
    s = RewardSample(sample_key("c", 1, "episodic"), "c", 1, "episodic", [{"role": "user", "content": "x"}],
                     empty, MemoryBank(), [q])
    reward = SessionReward(SessionRewardConfig(), embedder=HashEmbedder(64), tokenizer=WordTok())
    good = '{"operations": [{"action": "ADD", "memory": "2023-05-08: A went to the park"}]}'
    a, b, c = reward([s, s, s], [good, good, CUT], finish_reasons=["stop", "length", None])
    assert (a.gate, a.reward) == (1, 1.0)
    assert (b.gate, b.reward, b.error_type) == (0, 0.0, "truncated")
    assert (c.gate, c.reward, c.error_type) == (0, 0.0, "truncated")


def test_adrpo_reward_function_reads_truncation_from_token_ids():
    from training.adrpo_trainer import SessionRewardFunction

    fn = SessionRewardFunction(None, {}, num_generations=2)
    assert fn.finish_reasons([[5, 6, 2], [5, 6, 7]]) is None  # stop ids not set yet
    fn.stop_token_ids = {2, 0}
    assert fn.finish_reasons([[5, 6, 2], [5, 6, 7], [4, 0]]) == ["stop", "length", "stop"]


def test_program_runner_counts_cut_off_extractions_as_failures():
    from memory_bank.programs import read_program_source, reference_program_path
    from tests.helpers import TASK, Script, conversation

    REF = read_program_source(reference_program_path())
    from evolution.execution.runner import ProgramRunner, RunnerSettings
    from llm.runtime import Runtime

    rt = Runtime(embedder=HashEmbedder_())
    rt.register(TASK, LengthMarked(ScriptedBackend(Script(), model_id="task"),
                                   cut=lambda m: "memory units" in m[-1]["content"]))
    runner = ProgramRunner(rt, RunnerSettings(extractor="instruction", task_model=TASK, diagnostics=False))
    run = runner.run(REF, [conversation()])
    assert run.extraction["format_failures"] == 3 and run.extraction["units"] == 0


def HashEmbedder_():
    from llm.embeddings import HashEmbedder
    return HashEmbedder(dim=64)
