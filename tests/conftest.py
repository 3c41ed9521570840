"""Shared pytest fixtures.

Session defaults (set before anything loads a model): ``HF_HUB_OFFLINE=1`` (never touch the
hub) and ``MEMGYM_CACHE`` = ``<repo>/.cache/memgym`` unless already set, so prepared models
and tokenizers are reused across runs and CI (``.cache/`` is gitignored), and
``TORCH_EXTENSIONS_DIR`` = ``<repo>/.cache/torch_extensions`` (DeepSpeed's compiled CPU op, kept
per checkout).

Fixtures:
- ``tiny_model_dir`` (session): a random-weight ``LlamaForCausalLM`` (hidden 64, 2 layers,
  4 heads, 2 kv heads, intermediate 128, tied embeddings, init std 0.3, vocab = SmolLM2's
  49,152) with the real SmolLM2 tokenizer and chat template, saved with ``save_pretrained``.
  Seeded (0), so its weights are identical in every run.
- ``planted_dir`` (session): ``tiny_model_dir`` with a planted bigram path to the valid manager
  output ``{"operations": []}`` (:func:`tests.helpers.planted_policy`), for ADRPO runs.
- ``smollm2_dir`` (session): the real SmolLM2-135M-Instruct dir from ``prepare_smollm2()``
  (about 30 s the first time, under a file lock so that pytest-xdist workers convert it once);
  use in tests marked ``@pytest.mark.slow``.

Order: the files in ``SLOW_FIRST`` (minutes each) are collected first, each file's tests in their
own order, so that ``-n auto --dist loadfile`` starts the longest files at once and the short ones
fill the other workers (longest-processing-time-first scheduling); no test depends on file order.
- ``stub_backend``: factory for :class:`tests.helpers.ScriptedBackend`.

Tests marked ``vllm`` (tests/vllm/) are skipped, with the reason, where ``vllm`` is not importable.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("MEMGYM_CACHE", str(REPO / ".cache" / "memgym"))
# DeepSpeed JIT-builds its CPU comm op (deepspeed_shm_comm) into TORCH_EXTENSIONS_DIR; the default
# (~/.cache/torch_extensions) is shared by every checkout, and another venv's path in the build
# flags makes ninja rebuild it (measured: 186 s of the ZeRO-2 test's 257 s). One per checkout.
os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from tests.helpers import ScriptedBackend  # noqa: E402

TINY_CONFIG = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                   intermediate_size=128, max_position_embeddings=2048, tie_word_embeddings=True,
                   initializer_range=0.3)  # larger than the 0.02 default so greedy outputs vary by prompt


#: Files whose tests take minutes, longest first (``pytest --durations``).
SLOW_FIRST = ["tests/launch/test_zero3.py", "tests/evolution/execution/test_extract_stage.py",
              "tests/launch/test_cmd_launch.py",
              "tests/training/test_metrics.py", "tests/evolution/search/test_loop.py",
              "tests/evolution/search/test_beam.py", "tests/evolution/search/test_experiment.py",
              "tests/training/test_adrpo.py", "tests/rewards/scoring/test_evaluate.py",
              "tests/llm/test_structured.py", "tests/llm/test_models.py", "tests/launch/test_cmd_bank.py"]


def pytest_collection_modifyitems(config, items):
    rank = {f: i for i, f in enumerate(SLOW_FIRST)}
    items.sort(key=lambda item: rank.get(Path(str(item.path)).relative_to(REPO).as_posix(), len(rank)))
    import importlib.util

    if importlib.util.find_spec("vllm") is None:  # the vllm lane: make vllm && make test-vllm
        skip = pytest.mark.skip(reason="vllm is not importable in this venv (make vllm builds .venv-vllm; "
                                       "make test-vllm runs these)")
        for item in items:
            if item.get_closest_marker("vllm") is not None:
                item.add_marker(skip)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """Dir of a seeded random-weight tiny Llama with SmolLM2's real tokenizer."""
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    from memgym.llm.models import prepare_smollm2_tokenizer

    tok = AutoTokenizer.from_pretrained(str(prepare_smollm2_tokenizer()))
    out = tmp_path_factory.mktemp("tiny_model")
    cfg = LlamaConfig(vocab_size=len(tok), bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, **TINY_CONFIG)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = LlamaForCausalLM(cfg)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


@pytest.fixture(scope="session")
def planted_dir(tiny_model_dir, tmp_path_factory) -> Path:
    from tests.helpers import planted_policy

    return planted_policy(tiny_model_dir, tmp_path_factory.mktemp("planted"))


@pytest.fixture(scope="session")
def smollm2_dir() -> Path:
    """The prepared SmolLM2-135M-Instruct transformers dir (cached under $MEMGYM_CACHE)."""
    import fcntl

    from memgym.llm.models import prepare_smollm2
    from memgym.llm.paths import cache_dir

    with open(cache_dir() / ".smollm2-prepare.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released on close; a second worker then finds the dir complete
        return prepare_smollm2()


@pytest.fixture
def stub_backend():
    """Factory: ``stub_backend(responses, model_id="stub")`` -> :class:`ScriptedBackend`."""
    return ScriptedBackend
