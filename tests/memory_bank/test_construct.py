"""Session segmentation in memory construction: a BEAM session beyond the extractor's context
is built in consecutive segments (never truncated), each over the bank as it stands."""
from __future__ import annotations

import json
import warnings
from datetime import datetime

import pytest

from memgym.data_synth.beam import beam_root, load_beam
from memgym.data_synth.datasets import restrict
from memgym.data_synth.errors import DataQuirkWarning
from memgym.llm.base import GenerationParams
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.construct import ModelExtractor, construct
from memgym.memory_bank.schema import Conversation, Session, Turn
from tests.helpers import LengthMarked, ScriptedBackend


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
    assert n == len(built.outputs) == len(backend.seen) // 4
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


def test_sessions_with_zero_turns_are_flagged_and_cost_nothing():
    from memgym.memory_bank.construct import ModelExtractor, construct
    from memgym.memory_bank.schema import Conversation, Session, Turn
    from tests.helpers import ScriptedBackend

    s1 = Session(1, "s1", datetime(2023, 5, 8), "8 May 2023", (Turn("D1:1", "A", "hi"),))
    s2 = Session(2, "s2", datetime(2023, 5, 9), "9 May 2023", ())
    backend = ScriptedBackend(lambda m, p: '{"operation": "NONE"}' if "operation\"" in m[0]["content"] and
                              "operations" not in m[0]["content"] else '{"operations": []}')
    with pytest.warns(UserWarning, match="c session 2 .* has no turns"):
        res = construct(Conversation("c", ("A", "B"), (s1, s2), ()), ModelExtractor(backend))
    assert backend.calls == 4 and res.empty_sessions == [2] and len(res.snapshots) == 2


def _conv() -> Conversation:
    s = Session(1, "s1", datetime(2023, 5, 8), "8 May 2023", (Turn("D1:1", "A", "I went to the park"),))
    return Conversation("c", ("A", "B"), (s,), ())


def test_construction_counts_a_cut_off_rewrite_as_truncated_and_keeps_the_core():
    """The eval path (memory construction with a model extractor): a REWRITE that stopped on the
    token limit would shrink the core block to a fragment; it is a failure and the core stays."""
    from memgym.memory_bank.prompts import SYSTEM_PROMPTS

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
