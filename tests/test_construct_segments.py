"""Session segmentation in memory construction: a BEAM session beyond the extractor's context
is built in consecutive segments (never truncated), each over the bank as it stands."""
from __future__ import annotations

import warnings

import pytest

from data_synth.beam import beam_root, load_beam
from data_synth.errors import DataQuirkWarning
from data_synth.views import restrict
from llm.base import GenerationParams
from memory_bank.construct import ModelExtractor, construct
from tests.helpers import ScriptedBackend


@pytest.fixture(scope="module")
def chat3():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        return load_beam(beam_root() / "100K" / "3")[0]


def _manager_reply(messages, params):
    if "Your part is CORE" in messages[0]["content"]:
        return '{"operation": "NONE"}'
    return '{"operations": [{"action": "ADD", "memory": "a note"}]}'


def test_long_session_is_segmented_and_every_turn_is_seen(chat3):
    conv = restrict(chat3, 1)
    backend = ScriptedBackend(_manager_reply)
    ex = ModelExtractor(backend, GenerationParams(max_new_tokens=200), context_tokens=4000)
    assert ex.prompt_budget() == 3800
    built = construct(conv, ex)
    n = built.segments[1]
    assert n == built.n_segments == len(built.outputs) == len(backend.seen) // 4
    # the first session of 100K-3 has 170,615 transcript characters (~57K tokens at chars/3); each step has
    # 3800 tokens minus the prompt around the transcript (system prompt, core, shown entries)
    assert n == 22
    seen_ids = []
    for k in range(0, len(backend.seen), 4):
        prompts = [m for m, _ in backend.seen[k:k + 4]]
        assert max(ex.prompt_tokens(p) for p in prompts) <= 3800
        text = prompts[1][1]["content"].split("New session transcript:\n", 1)[1]
        seen_ids += [line.split("]")[0][1:] for line in text.splitlines() if line.startswith("[")
                     and line.split("]")[0][1:].isdigit()]
    turn_ids = [t.id for t in conv.sessions[0].turns]
    assert list(dict.fromkeys(seen_ids)) == turn_ids  # every turn, in order, none dropped
    # each segment saw the bank as it stood: the 2nd step's episodic prompt shows the 1st step's entry
    assert "a note" in backend.seen[5][0][1]["content"]
    assert built.attempts["core"] == n and not built.failures


def test_fitting_session_is_one_step_and_unknown_context_never_splits(chat3):
    conv = restrict(chat3, 1)
    backend = ScriptedBackend(_manager_reply)
    built = construct(conv, ModelExtractor(backend, GenerationParams(max_new_tokens=64)))  # no context known
    assert built.segments == {1: 1} and len(backend.seen) == 4
    with pytest.raises(ValueError, match="must exceed the output budget"):
        ModelExtractor(backend, GenerationParams(max_new_tokens=64), context_tokens=64)


def test_a_turn_longer_than_the_room_is_split_into_parts(chat3):
    conv = restrict(chat3, 1)
    backend = ScriptedBackend(_manager_reply)
    ex = ModelExtractor(backend, GenerationParams(max_new_tokens=100), context_tokens=3000)
    longest = max(conv.sessions[0].turns, key=lambda t: len(t.text))
    assert len(longest.text) == 9567  # ~3,190 tokens at chars/3: over the 2,900-token budget on its own
    built = construct(conv, ex)
    texts = [m[1]["content"] for m, _ in backend.seen]
    assert sum(f"[{longest.id}] assistant: (part " in t for t in texts) >= 2 * 4
    assert "".join(t.split(f"[{longest.id}] assistant: (part ")[1].split(") ", 1)[1].split("\n[")[0]
                   for t in texts[1::4] if f"[{longest.id}] assistant: (part " in t).startswith(longest.text[:200])
    assert all(ex.prompt_tokens(m) <= 2900 for m, _ in backend.seen)
    assert built.segments[1] == len(backend.seen) // 4
