"""``memgym bench embed``'s chat statistics, counted by hand (the timings are printed, never asserted)."""
from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def minilm_model():
    from llm.embeddings import STEmbedder

    return STEmbedder().model


def test_chat_stats_hand_counts(minilm_model):
    from launch.bench.embed import chat_stats

    # "a b c": [CLS] a b c [SEP] = 5 word pieces; "x": 3; 300 words: 302, over the cap of 256
    lines = ["a b c", "a b c", "x", " ".join(["word"] * 300)]
    s = chat_stats(minilm_model, lines, batch=2)
    assert s["lines"] == 4 and s["distinct_share"] == 0.75 and s["cap"] == 256
    assert s["share_over_cap"] == 0.25 and s["share_over_128"] == 0.25
    # sorted by used length: 256, 5 | 5, 3 -> padded 2*256 + 2*5 = 522, used 256+5+5+3 = 269
    assert s["padding_waste"] == round(1 - 269 / 522, 4)
    assert s["mean_chars"] == round((5 + 5 + 1 + 1499) / 4, 1)


def test_beam_lines_are_cut_like_the_programs():
    from launch.bench.embed import EMBED_CHARS, _lines
    from memory_bank.programs import dense_topk

    lines, questions = _lines("100K-4")
    assert EMBED_CHARS == dense_topk.EMBED_CHARS
    assert len(questions) == 20 and max(len(x) for x in lines) == EMBED_CHARS
