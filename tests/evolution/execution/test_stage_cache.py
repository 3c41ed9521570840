"""Tests of :mod:`memgym.evolution.execution.stage_cache`: every settings field that changes a
stage's output is in that stage's key, and every other field is declared key-neutral."""
from __future__ import annotations

import dataclasses

import pytest

from memgym.evolution.execution.component_diff import STAGES
from memgym.evolution.execution.settings import RunnerSettings
from memgym.evolution.execution.stage_cache import (CACHE_FORMAT, KEY_NEUTRAL, STAGE_SETTINGS, stable_hash,
                                                    stage_settings)

#: the modes under which the fields apply: instruction extraction with LLM plans and an LLM judge,
#: a trained extractor with answers, turns with an offline scorer
BASES = [
    RunnerSettings(extractor="instruction", plan_mode="llm", scorer="llm", judge_model="openai:http://j#j",
                   dataset=None, constrained=True, constrained_max_chars=100, constrained_max_items=3,
                   program_llm_calls=2),
    RunnerSettings(extractor="openai:http://e#ext", plan_mode="question", scorer="f1", constrained=True,
                   constrained_max_chars=100, constrained_max_items=3, extractor_context_tokens=2048,
                   extractor_segment_tokens=200),
    RunnerSettings(extractor="turns", plan_mode="question", scorer="grounded-recall"),
    RunnerSettings(extractor="turns", plan_mode="question", scorer="llm", judge_model="openai:http://j#j",
                   dataset="locomo"),
]

#: a changed value of each field (a valid one, never the bases' values)
CHANGED = {
    "dataset": "longmemeval", "path": "/data/other.json", "beam_full_chat": True, "beam_keep_markers": True,
    "n_sessions": 4, "max_questions": 7, "judge_protocol": "custom:/judges/edited.json",
    "task_model": "openai:http://t#other", "judge_model": "openai:http://j#other", "batch_size": 3,
    "cache": "/tmp/other.sqlite", "request_timeout_s": 5.0, "request_retries": 1,
    "extractor": "expert:conv-30", "plan_mode": None, "scorer": "answer-recall", "extract_max_new_tokens": 77,
    "extractor_max_new_tokens": 77, "extractor_context_tokens": 999, "extractor_segment_tokens": 99,
    "plan_max_new_tokens": 77, "answer_max_new_tokens": 77, "program_llm_calls": 5, "diagnostics": False,
    "constrained": None, "constrained_max_chars": 55, "constrained_max_items": 9, "judge_constrained": True,
    "call_timeout_s": 3.0, "workers": 4, "context_tokens": 64, "context_tokenizer": "hf:/tok",
    "progress": False,
}


def _identity(spec: str) -> str:
    return f"id<{spec}>"


def _keys(s: RunnerSettings) -> dict[str, str]:
    from memgym.rewards.scoring import judge_protocols

    real = judge_protocols.protocol_identity
    judge_protocols.protocol_identity = lambda d, p: p  # a custom protocol file need not exist here
    try:
        return {st: stable_hash(stage_settings(st, s, _identity)) for st in STAGES}
    finally:
        judge_protocols.protocol_identity = real


def _changed(s: RunnerSettings, name: str) -> RunnerSettings:
    value = CHANGED[name]
    if value is None:  # a switch or a mode: flip it
        value = {"plan_mode": "question" if s.plan_mode == "llm" else "llm"}.get(name, not getattr(s, name))
    out = dataclasses.replace(s)  # no __post_init__ checks on purpose: only the key is read
    object.__setattr__(out, name, value)
    return out


def test_every_settings_field_is_in_a_stage_key_or_declared_key_neutral():
    names = [f.name for f in dataclasses.fields(RunnerSettings)]
    assert set(CHANGED) == set(names), "give the new field a changed value above"
    keyed = {f for fields in STAGE_SETTINGS.values() for f in fields}
    assert not keyed & set(KEY_NEUTRAL) and set(STAGE_SETTINGS) == set(STAGES)
    assert set(names) == keyed | set(KEY_NEUTRAL), "declare the field in STAGE_SETTINGS or KEY_NEUTRAL"
    for name in names:
        moved = {st for s in BASES for st, k in _keys(_changed(s, name)).items() if k != _keys(s)[st]}
        if name in KEY_NEUTRAL:
            assert not moved, f"{name} is declared key-neutral ({KEY_NEUTRAL[name]}) but moves {moved}"
        else:
            stages = {st for st, fields in STAGE_SETTINGS.items() if name in fields}
            assert moved == stages, f"{name}: declared for {sorted(stages)}, moves {sorted(moved)}"


def test_a_field_that_does_not_apply_leaves_the_key_alone():
    turns = BASES[2]
    for name in ("extract_max_new_tokens", "extractor_max_new_tokens", "constrained", "plan_max_new_tokens",
                 "judge_model", "program_llm_calls"):
        moved = {st for st, k in _keys(_changed(turns, name)).items() if k != _keys(turns)[st]}
        assert moved <= ({"index"} if name == "program_llm_calls" else set()), (name, moved)
    assert stage_settings("extract", turns, _identity) == {
        "mode": "turns", "extractor": None, "task": None, "max_new_tokens": None, "context_tokens": None,
        "segment_tokens": None, "constrained": None}
    assert stage_settings("answer", BASES[1], _identity) == {"task": "id<hf:smollm2>", "max_new_tokens": 48}


def test_the_cache_format_is_in_every_key():
    assert CACHE_FORMAT == "memgym-stages-v2"
    assert stable_hash("x") != stable_hash("y")
    import hashlib
    assert stable_hash("x") == hashlib.sha256(b'["memgym-stages-v2","x"]').hexdigest()


@pytest.mark.parametrize("stage", ["extract", "plan", "answer", "score"])
def test_a_stage_key_holds_the_model_identity_not_the_spec(stage):
    s = BASES[0]
    got = stage_settings(stage, s, _identity)
    assert any(isinstance(v, str) and v.startswith("id<") for v in got.values()), got
