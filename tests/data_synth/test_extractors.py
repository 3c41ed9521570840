"""memgym.data_synth.extractors: the one parser of extractor specs (kinds, expert files, errors)."""
from __future__ import annotations

import pytest

from memgym.data_synth.expert import ExpertExtractor
from memgym.data_synth.extractors import expert_paths, extractor_kind, make_extractor, resolve_expert_path
from memgym.data_synth.paths import expert_dir
from memgym.launch.cli import main as memgym


def test_kinds_and_expert_paths():
    assert [extractor_kind(s) for s in ("instruction", "turns", "expert:conv-30", "hf:smollm2",
                                        "openai:http://x/v1#m")] == ["instruction", "turns", "expert", "extractor",
                                                                     "extractor"]
    assert expert_paths("expert:conv-26, conv-30.jsonl") == [expert_dir() / "conv-26.jsonl",
                                                              expert_dir() / "conv-30.jsonl"]
    with pytest.raises(ValueError, match="names no trajectory file"):
        extractor_kind("expert:")
    with pytest.raises(ValueError, match="non-empty"):
        extractor_kind(" ")
    with pytest.raises(FileNotFoundError, match="conv-99"):
        resolve_expert_path("conv-99")


def test_make_extractor_expert_and_instruction():
    ext = make_extractor("expert:conv-30", rt=None)
    assert isinstance(ext, ExpertExtractor) and ext.conversation_ids == ["conv-30"]
    # conv-30's trajectory has one line per session: 19 sessions, none missing
    assert sum(1 for c, _ in ext.steps if c == "conv-30") == 19
    with pytest.raises(ValueError, match="builds no bank"):
        make_extractor("instruction", rt=None)


def test_an_expert_file_of_another_conversation(tiny_model_dir, tmp_path, capsys):
    from memgym.data_synth.datasets import load_conversations
    from memgym.data_synth.extractors import ExtractorCoverageError, make_extractor

    conv = load_conversations("locomo", ids=["conv-26"], n_sessions=2)
    with pytest.raises(ExtractorCoverageError, match=r"^expert:conv-30.jsonl holds trajectories of conv-30, none of "
                                                     r"conv-26: pass expert:conv-26 \(if that file exists\) or "
                                                     r"evaluate conv-30$"):
        make_extractor("expert:conv-30", None, conversations=conv)
    assert make_extractor("expert:conv-26", None, conversations=conv).name == "expert:conv-26.jsonl"
    rc = memgym(["eval", "--conversations", "conv-26", "--n_sessions", "2", "--max_questions", "3", "--extractor",
                 "expert:conv-30", "--scorer", "answer-recall", "--task_model", f"hf:{tiny_model_dir}",
                 "--out", str(tmp_path / "ev"), "--no_progress", "--cache", "none"])
    assert rc == 2
    err = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("memgym eval")]
    assert err == ["memgym eval: expert:conv-30.jsonl holds trajectories of conv-30, none of conv-26: pass "
                   "expert:conv-26 (if that file exists) or evaluate conv-30"]
