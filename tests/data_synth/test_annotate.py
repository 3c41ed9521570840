"""The LLM capability annotator: validation, retries, native fallback, caching, test refusal."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest

from memgym.data_synth.annotate import (AnnotatedLabel, CapabilityAnnotator, LabelValidationError, apply_labels, load_labels,
                                 parse_label)
from memgym.data_synth.errors import DataFormatError
from memgym.memory_bank.schema import Capability
from tests.helpers import ScriptedBackend, conversation

F, T, P, M, A = (Capability.FACTUAL, Capability.TEMPORAL, Capability.PREFERENCE, Capability.MULTI_SESSION,
                 Capability.ADVERSARIAL)


def test_parse_label_accepts_valid_and_rejects_bad_labels():
    assert parse_label('```json\n{"primary": "t", "secondary": ["M"]}\n```').model_dump() == \
        {"primary": "T", "secondary": ["M"]}
    assert parse_label('{"primary": "F"}').secondary == []
    for bad, why in [('{"primary": "X", "secondary": []}', "primary"),
                     ('{"primary": "T", "secondary": ["Q"]}', "secondary"),
                     ('{"primary": "T", "secondary": ["M", "M"]}', "duplicates"),
                     ('{"primary": "T", "secondary": ["T"]}', "also listed"),
                     ('{"primary": "T", "secondary": ["F", "P", "M"]}', "at most 2"),
                     ('{"primary": "T", "extra": 1}', "extra"),
                     ("T, with M", "no JSON object"), ("", "empty")]:
        with pytest.raises(LabelValidationError, match=why):
            parse_label(bad)


def _conv(cid="conv-26"):
    return replace(conversation(), id=cid)


def test_retry_then_cache_hit_on_repeat(tmp_path):
    replies = {"c/q0": ['{"primary": "F"}'], "c/q1": ['{"primary": "Z"}', '{"primary": "P", "secondary": ["F"]}'],
               "c/q2": ['{"primary": "T", "secondary": ["M"]}'], "c/q3": ['{"primary": "M", "secondary": ["T", "F"]}']}
    seen = []

    def answer(messages, params):
        qid = next(k for k, q in zip(replies, ["go to?", "her kids?", "a talk?", "sign up for?"])
                   if q in messages[1]["content"])
        seen.append((qid, len(messages)))
        return replies[qid][(len(messages) - 2) // 2]

    backend = ScriptedBackend(answer, model_id="annot")
    labels_file = tmp_path / "labels.jsonl"
    ann = CapabilityAnnotator(backend, labels_file, max_retries=2)
    out = ann.annotate("locomo", [_conv()], "train")
    assert {k: (v.primary, v.secondary) for k, v in out.items()} == {
        "c/q0": (F, ()), "c/q1": (P, (F,)), "c/q2": (T, (M,)), "c/q3": (M, (T, F))}
    assert out["c/q1"].attempts == 2 and out["c/q0"].attempts == 1 and not out["c/q1"].fallback
    assert backend.calls == 5 and ("c/q1", 4) in seen  # the retry shows the bad reply and the reason
    retry_prompt = backend.seen[-1][0][-1]["content"]
    assert "invalid" in retry_prompt and "primary" in retry_prompt
    assert len(labels_file.read_text().splitlines()) == 4

    again = CapabilityAnnotator(backend, labels_file).annotate("locomo", [_conv()], "valid")
    assert backend.calls == 5  # every label came from the label file
    assert {k: v.primary for k, v in again.items()} == {k: v.primary for k, v in out.items()}
    assert load_labels(labels_file)["c/q3"].secondary == (T, F)


def test_invalid_every_time_falls_back_to_native_with_a_flag(tmp_path):
    backend = ScriptedBackend(lambda m, p: '{"primary": "Q"}', model_id="annot")
    out = CapabilityAnnotator(backend, None, max_retries=1).annotate("locomo", [_conv()], "train")
    assert backend.calls == 8  # 4 questions x (1 + 1 retry)
    q3 = out["c/q3"]  # LoCoMo category 1 -> M; evidence in sessions 1 and 3 (zz:9 unknown)
    assert (q3.primary, q3.secondary, q3.source, q3.fallback, q3.attempts) == (M, (), "native", True, 2)
    assert out["c/q2"].primary is T and "primary" in out["c/q2"].error


def test_refuses_the_test_split_before_any_call(tmp_path):
    backend = ScriptedBackend(lambda m, p: '{"primary": "F"}')
    ann = CapabilityAnnotator(backend, tmp_path / "l.jsonl")
    with pytest.raises(ValueError, match="test split"):
        ann.annotate("locomo", [_conv()], "test")
    with pytest.raises(ValueError, match="conv-43"):  # a LoCoMo test conversation, whatever split is claimed
        ann.annotate("locomo", [_conv("conv-43")], "train")
    assert backend.calls == 0 and not (tmp_path / "l.jsonl").exists()


def test_apply_and_load_labels(tmp_path):
    conv = _conv()
    lab = AnnotatedLabel("c/q0", P, (A,), "annotator", False, 1, "m")
    new = apply_labels([conv], {"c/q0": lab})[0]
    assert (new.questions[0].capability, new.questions[0].secondary) == (P, (A,))
    assert conv.questions[0].capability is F and new.questions[1] == conv.questions[1]
    p = tmp_path / "labels.jsonl"
    p.write_text(json.dumps(lab.to_json()) + "\n" + json.dumps({**lab.to_json(), "primary": "Q"}) + "\n")
    with pytest.raises(DataFormatError, match="line 2"):
        load_labels(p)
    with pytest.raises(FileNotFoundError, match="labels.jsonl"):
        load_labels(tmp_path / "no" / "labels.jsonl")
