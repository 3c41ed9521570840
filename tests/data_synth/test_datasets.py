"""memgym.data_synth.datasets: the one name → loader dispatch, with ids, splits and trimming
(exact counts from the shipped LoCoMo and LongMemEval files)."""
from __future__ import annotations

import warnings

import pytest

from memgym.data_synth.datasets import conversations_by_id, load_conversations


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def test_split_ids_and_trimming():
    valid = load_conversations("locomo", split="valid")
    assert [(c.id, len(c.sessions), len(c.questions)) for c in valid] == [("conv-41", 32, 193), ("conv-42", 29, 260)]
    # file order, duplicates dropped; first 2 sessions, then at most 3 QA each
    trimmed = load_conversations("locomo", ids=["conv-30", "conv-26", "conv-30"], n_sessions=2, max_questions=3)
    assert [(c.id, len(c.sessions), len(c.questions)) for c in trimmed] == [("conv-26", 2, 3), ("conv-30", 2, 3)]
    assert len(load_conversations("longmemeval", split="sft")) == 50
    assert sorted(conversations_by_id("locomo", ["conv-42", "conv-41"])) == ["conv-41", "conv-42"]


def test_bad_names_raise_naming_them():
    with pytest.raises(ValueError, match="not in split 'valid': conv-26"):
        load_conversations("locomo", ids=["conv-26"], split="valid")
    with pytest.raises(ValueError, match="unknown dataset 'nope'"):
        load_conversations("nope")
    with pytest.raises(ValueError, match="conv-99"):
        load_conversations("locomo", ids=["conv-99"])
