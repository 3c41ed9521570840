"""data_synth.extractors: the one parser of extractor specs (kinds, expert files, errors)."""
from __future__ import annotations

import pytest

from data_synth.expert import ExpertExtractor
from data_synth.extractors import expert_paths, extractor_kind, make_extractor, resolve_expert_path
from data_synth.paths import expert_dir


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
