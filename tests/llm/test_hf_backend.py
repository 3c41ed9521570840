"""HFBackend on the tiny random-weight Llama (real SmolLM2 tokenizer)."""
from __future__ import annotations

import pytest
import torch

from memgym.llm.base import BackendSpecError, BatchError, GenerationParams
from memgym.llm.hf_backend import HFBackend

BATCH = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Remember that Caroline adopted a dog named Max in May 2023. " * 3}],
]


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    return HFBackend(tiny_model_dir, batch_size=8)


def test_greedy_is_deterministic_and_batch_equals_one_by_one(backend):
    params = GenerationParams(max_new_tokens=10)
    a = backend.generate(BATCH, params)
    b = backend.generate(BATCH, params)
    one = [backend.generate([m], params)[0] for m in BATCH]
    assert a == b == one
    assert len({c.text for c in a}) == 3  # the prompts really lead to different outputs


def test_small_batch_size_chunks_give_same_greedy_output(tiny_model_dir, backend):
    params = GenerationParams(max_new_tokens=6)
    chunked = HFBackend(tiny_model_dir, batch_size=2)
    assert chunked.generate(BATCH, params) == backend.generate(BATCH, params)
    assert chunked.calls == 3  # one per prompt, not per chunk


def test_token_counts_are_exact(backend):
    params = GenerationParams(max_new_tokens=7)
    out = backend.generate(BATCH, params)
    tok = backend.tokenizer
    for messages, c in zip(BATCH, out):
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True, return_dict=True)["input_ids"]
        assert c.prompt_tokens == len(ids)
        assert c.completion_tokens == 7 and c.finish_reason == "length"
        assert c.cached is False
    # the 'hi' prompt: SmolLM2's default system line + user turn + generation prompt
    assert out[0].prompt_tokens == 31
    assert backend.count_tokens("hello world") == 2


def test_eos_counts_up_to_and_including_eos_and_ignores_padding(tiny_model_dir):
    """Force row 0 to emit EOS at its 3rd step; row 1 never stops. Row 0 must report
    3 completion tokens and 'stop' although the batch runs on (padding) to max_new_tokens."""
    b = HFBackend(tiny_model_dir)
    eos = b.tokenizer.eos_token_id
    step = {"n": 0}

    def force_eos(module, args, output):
        if step["n"] == 2:
            output[0, -1, :] = -1e9
            output[0, -1, eos] = 1e9
        output[1:, -1, eos] = -1e9
        step["n"] += 1
        return output

    handle = b.model.get_output_embeddings().register_forward_hook(force_eos)
    try:
        out = b.generate(BATCH[:2], GenerationParams(max_new_tokens=8))
    finally:
        handle.remove()
    assert (out[0].completion_tokens, out[0].finish_reason) == (3, "stop")
    assert (out[1].completion_tokens, out[1].finish_reason) == (8, "length")
    assert b.count_tokens(out[0].text) <= 2  # the EOS is not part of the text


def test_sampling_with_seed_is_reproducible(backend):
    p = GenerationParams(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=7)
    state = torch.get_rng_state()
    a = backend.generate(BATCH, p)
    assert torch.equal(state, torch.get_rng_state())  # the global RNG is left untouched
    assert backend.generate(BATCH, p) == a
    other = backend.generate(BATCH, GenerationParams(max_new_tokens=8, temperature=1.0, top_p=0.95, seed=8))
    assert [c.text for c in other] != [c.text for c in a]
    greedy = backend.generate(BATCH, GenerationParams(max_new_tokens=8))
    assert [c.text for c in greedy] != [c.text for c in a]


def test_calls_count_prompts(tiny_model_dir):
    b = HFBackend(tiny_model_dir, batch_size=2)
    assert b.generate([], GenerationParams(max_new_tokens=2)) == []
    b.generate(BATCH, GenerationParams(max_new_tokens=2))
    assert b.calls == 3


def test_bad_batch_raises_before_generation(backend):
    before = backend.calls
    with pytest.raises(BatchError, match=r"batch\[1\]\[0\]\['role'\]"):
        backend.generate([BATCH[0], [{"role": "robot", "content": "x"}]], GenerationParams())
    with pytest.raises(BatchError, match=r"batch\[0\]\[0\]\['content'\]"):
        backend.generate([[{"role": "user", "content": None}]], GenerationParams())
    assert backend.calls == before


def test_missing_dir_and_adapter_without_local_base(tmp_path):
    with pytest.raises(BackendSpecError, match="does not exist"):
        HFBackend(tmp_path / "nope")
    (tmp_path / "adapter_config.json").write_text('{"base_model_name_or_path": "HuggingFaceTB/SmolLM2-135M"}')
    with pytest.raises(BackendSpecError, match="not a local dir"):
        HFBackend(tmp_path)


def test_peft_adapter_dir_loads_on_its_base(tiny_model_dir, tmp_path, backend):
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(str(tiny_model_dir))
    peft_model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    adapter = tmp_path / "adapter"
    peft_model.save_pretrained(str(adapter))
    b = HFBackend(adapter)
    assert "+" in b.model_id and b.model_id != backend.model_id
    params = GenerationParams(max_new_tokens=6)
    out = b.generate(BATCH, params)
    assert [c.prompt_tokens for c in out] == [c.prompt_tokens for c in backend.generate(BATCH, params)]
    # random (non-zero) LoRA weights change the greedy output of at least one prompt
    assert [c.text for c in out] != [c.text for c in backend.generate(BATCH, params)]
