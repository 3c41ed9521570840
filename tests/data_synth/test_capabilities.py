"""Capability mapping (docs/design.md § "Data model"), splits and data paths."""
from __future__ import annotations

import json
import os

import pytest

from memgym.data_synth import paths
from memgym.data_synth.capabilities import (BEAM_MAP, by_capability, capability_for, count_by_capability, native_capability,
                                     secondary_for)
from memgym.data_synth.errors import DataFileNotFoundError, DataFormatError
from memgym.data_synth.paths import data_root
from memgym.data_synth.splits import is_test_split, longmemeval_splits, split_ids, split_names
from memgym.memory_bank.schema import Capability, QAItem

F, T, P, M, A = (Capability.FACTUAL, Capability.TEMPORAL, Capability.PREFERENCE,
                 Capability.MULTI_SESSION, Capability.ADVERSARIAL)


@pytest.mark.parametrize("cat, cap", [(4, F), ("2", T), (1, M), ("3", P), (5, A)])
def test_locomo_mapping(cat, cap):
    assert capability_for("locomo", cat) is cap


@pytest.mark.parametrize("cat, cap", [
    ("single-session-user", F), ("single-session-assistant", F), ("temporal-reasoning", T),
    ("single-session-preference", P), ("multi-session", M), ("knowledge-update", T)])
def test_longmemeval_mapping(cat, cap):
    assert capability_for("longmemeval", cat, "0a1b2c") is cap
    assert capability_for("longmemeval", cat, "0a1b2c_abs") is A


@pytest.mark.parametrize("cat, cap", [
    ("information extraction", F), ("Temporal Reasoning", T), ("event_ordering", T),
    ("knowledge-update", T), ("preference following", P), ("instruction_following", P),
    ("multi-session reasoning", M), ("summarization", M), ("abstention", A),
    ("contradiction resolution", A)])
def test_beam_mapping(cat, cap):
    assert capability_for("beam", cat) is cap


def test_beam_has_ten_abilities():
    assert len(BEAM_MAP) == 10
    assert sorted(c.value for c in BEAM_MAP.values()) == sorted("FTTTPPMMAA")


def test_unknown_labels_raise():
    with pytest.raises(ValueError, match="unknown locomo category 6"):
        capability_for("locomo", 6)
    with pytest.raises(ValueError, match="unknown longmemeval category 'trivia'"):
        capability_for("longmemeval", "trivia", "x_abs")
    with pytest.raises(ValueError, match="unknown dataset 'squad'"):
        native_capability("squad", "1")


def test_secondary_rule():
    assert secondary_for("locomo", 4, None, 1) == ()
    assert secondary_for("locomo", 2, None, 2) == (M,)
    assert secondary_for("locomo", 1, None, 3) == ()            # primary already M
    assert secondary_for("longmemeval", "temporal-reasoning", "q_abs", 2) == (T, M)
    assert secondary_for("longmemeval", "multi-session", "q_abs", 3) == (M,)
    assert secondary_for("longmemeval", "multi-session", "q", 3) == ()
    with pytest.raises(ValueError, match="n_evidence_sessions"):
        secondary_for("locomo", 4, None, -1)


def test_by_capability_groups():
    qs = [QAItem("a", "?", "x", capability=F), QAItem("b", "?", "x", capability=A),
          QAItem("c", "?", "x", capability=F), QAItem("d", "?", "x")]
    g = by_capability(qs)
    assert list(g) == [F, T, P, M, A]
    assert [q.id for q in g[F]] == ["a", "c"] and g[T] == [] and [q.id for q in g[A]] == ["b"]
    assert count_by_capability(qs) == {"F": 2, "T": 0, "P": 0, "M": 0, "A": 1}


def test_locomo_splits():
    assert split_names("locomo") == ("train", "valid", "test")
    assert split_ids("locomo", "train") == ["conv-26", "conv-30"]
    assert split_ids("locomo", "valid") == ["conv-41", "conv-42"]
    assert split_ids("locomo", "test") == ["conv-43", "conv-44", "conv-47", "conv-48",
                                           "conv-49", "conv-50"]
    assert is_test_split("locomo", "test") and not is_test_split("locomo", "train")
    with pytest.raises(ValueError, match="unknown locomo split 'sft'"):
        is_test_split("locomo", "sft")
    with pytest.raises(ValueError, match="no splits defined"):
        split_ids("babilong", "test")


def test_longmemeval_splits_shipped():
    s = longmemeval_splits()
    assert {k: len(v) for k, v in s.items()} == {"sft": 50, "rl": 50, "test": 400}
    with open(paths.longmemeval_oracle_path(), encoding="utf-8") as fh:
        oracle_ids = {r["question_id"] for r in json.load(fh)}
    assert set(s["sft"]) | set(s["rl"]) | set(s["test"]) == oracle_ids
    assert split_ids("longmemeval", "rl") == s["rl"]
    assert is_test_split("longmemeval", "test") and not is_test_split("longmemeval", "rl")


@pytest.mark.parametrize("data, record, field, reason", [
    ({"sft": [], "rl": []}, "-", "-", "expected keys"),
    ({"sft": ["a"], "rl": "b", "test": []}, "rl", "-", "expected a list"),
    ({"sft": ["a"], "rl": [3], "test": []}, "rl", "[0]", "expected str"),
    ({"sft": ["a"], "rl": ["b"], "test": ["c", "a"]}, "test", "[1]", "also in split 'sft'"),
])
def test_bad_splits_file(tmp_path, data, record, field, reason):
    p = tmp_path / "splits.json"
    p.write_text(json.dumps(data), encoding="utf-8")
    with pytest.raises(DataFormatError, match=reason) as ei:
        longmemeval_splits(p)
    assert (ei.value.file, ei.value.record, ei.value.field) == (str(p), record, field)


def test_data_root_env_and_default(monkeypatch, tmp_path):
    monkeypatch.setenv("MEMGYM_DATA", str(tmp_path))
    assert paths.data_root() == tmp_path.resolve()
    assert paths.locomo_path() == tmp_path.resolve() / "locomo" / "locomo10.json"
    assert paths.longmemeval_splits_path().name == "splits.json"
    assert paths.expert_dir() == tmp_path.resolve() / "expert"
    with pytest.raises(DataFileNotFoundError) as ei:
        paths.require(paths.locomo_path(), "LoCoMo file")
    msg = str(ei.value)
    assert msg.startswith(f"LoCoMo file not found: expected at {paths.locomo_path()}.")
    assert "MEMGYM_DATA" in msg and ei.value.path == str(paths.locomo_path())
    monkeypatch.delenv("MEMGYM_DATA")
    monkeypatch.chdir(tmp_path)  # cwd/../shared/data absent -> falls back to repo root's
    root = paths.data_root()
    assert root == (paths.REPO_ROOT / ".." / "shared" / "data").resolve()
    assert os.path.basename(root) == "data"


def test_read_json_folder_is_format_error(tmp_path):
    with pytest.raises(DataFormatError, match="is a folder"):
        paths.read_json(tmp_path, "thing")


def test_longmemeval_s_splits_by_name():
    s_splits = data_root() / "longmemeval" / "s_splits.json"
    sizes = {name: len(split_ids("longmemeval", name, s_splits)) for name in ("train", "valid", "test")}
    assert sizes == {"train": 52, "valid": 47, "test": 100}  # data README: {train: 52, valid: 47, test: 100}
    with pytest.raises(ValueError, match="s_splits.json"):
        split_ids("longmemeval", "train")  # splits.json has sft/rl/test only
