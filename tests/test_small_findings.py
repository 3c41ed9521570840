"""Issue 12, finding 11: the smaller ones (model-name typos, the ADRPO divisibility message,
sessions with zero turns)."""
from __future__ import annotations

from datetime import datetime

import pytest

from llm.base import BackendSpecError
from llm.errors import ConfigError


def test_model_name_typos_suggest_the_embedded_model(tmp_path, monkeypatch):
    from llm.specs import resolve_model_path
    from training.common import resolve_model_path as policy_path

    monkeypatch.chdir(tmp_path)
    with pytest.raises(BackendSpecError, match="did you mean hf:smollm2"):
        resolve_model_path("hf:smolm2")
    with pytest.raises(ConfigError, match="did you mean 'smollm2'"):
        policy_path("smolm2")
    assert policy_path("Qwen/Qwen3-4B-Instruct-2507") == "Qwen/Qwen3-4B-Instruct-2507"  # hub ids pass through


def test_adrpo_divisibility_names_the_flags_the_user_set(tmp_path):
    from training.adrpo_config import ADRPOConfig, ADRPOConfigError

    with pytest.raises(ADRPOConfigError) as e:
        ADRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, report_to="none",
                    per_device_train_batch_size=3, gradient_accumulation_steps=1, num_generations=2)
    msg = str(e.value)
    assert "per_device_train_batch_size (3)" in msg and "num_generations (2)" in msg
    assert "--gradient_accumulation_steps" in msg


def test_sessions_with_zero_turns_are_flagged_and_cost_nothing():
    from memory_bank.construct import ModelExtractor, construct
    from memory_bank.schema import Conversation, Session, Turn
    from tests.helpers import ScriptedBackend

    s1 = Session(1, "s1", datetime(2023, 5, 8), "8 May 2023", (Turn("D1:1", "A", "hi"),))
    s2 = Session(2, "s2", datetime(2023, 5, 9), "9 May 2023", ())
    backend = ScriptedBackend(lambda m, p: '{"operation": "NONE"}' if "operation\"" in m[0]["content"] and
                              "operations" not in m[0]["content"] else '{"operations": []}')
    with pytest.warns(UserWarning, match="c session 2 .* has no turns"):
        res = construct(Conversation("c", ("A", "B"), (s1, s2), ()), ModelExtractor(backend))
    assert backend.calls == 4 and res.empty_sessions == [2] and len(res.snapshots) == 2
