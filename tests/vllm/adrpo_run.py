"""Two ADRPO steps of SmolLM2 (full fine-tuning, like launch/recipes/adrpo_qwen3_4b_*.yaml) with
``use_vllm: true`` on vLLM's CPU build, in a process of its own (vLLM's colocate engine sets up
torch.distributed and environment variables); prints one JSON line of measurements. Run by
tests/vllm/test_adrpo.py: ``python -m tests.vllm.adrpo_run colocate|server MODEL_DIR OUT [BASE_URL]``.

colocate: TRL's in-process engine generates every rollout (its ``generate`` is counted, the
policy's own ``generate`` never runs) and receives the policy's weights before each step
(``VLLMGeneration.sync_weights``, TRL's call). A callback records, per step, the policy's
``model.embed_tokens.weight`` (tied to the LM head) when the step begins and vLLM's copy of it when the
step ends; then vLLM's log-probability of a fixed completion before training and after the last
sync; and whether TRL's own ``VLLMGeneration.sync_weights`` fails on this build. server: the trainer against the ``memgym serve --weight-sync`` server; the error is reported.
"""
from __future__ import annotations

import json
import sys
import traceback

PARAM = "model.embed_tokens.weight"  # kept by vLLM on CPU, where linear weights are packed away


def argv(mode: str, model: str, out: str, base_url: str | None) -> list[str]:
    """launch/recipes/adrpo_cpu.yaml's reward and GRPO settings as flags, full fine-tuning, tiny
    batches. Not the recipe itself: its ``activation_checkpointing`` is transformers 5.24's name, and
    vLLM 0.32 pins transformers < 5.20, whose TrainingArguments call it ``gradient_checkpointing``."""
    a = ["--model_name_or_path", model, "--use_peft", "false", "--train_trajectories", "conv-26",
         "--max_prompt_tokens", "1200", "--mode", "counterfactual", "--judge", "answer-recall", "--loss_type", "dapo",
         "--temperature", "0.8", "--top_p", "0.9", "--beta", "0.02", "--lr_scheduler_type", "constant",
         "--gradient_checkpointing", "false", "--logging_steps", "1", "--seed", "0",
         # the base SmolLM2 fails the format gate on every completion (rewards and advantages 0, no
         # gradient); TRL's entropy bonus gives each step one, so the weights move and the sync shows
         "--entropy_coef", "0.01",
         "--output_dir", out, "--max_steps", "2", "--embedder", "hash:64", "--sessions", "1",
         "--managers", "episodic", "--num_generations", "2", "--per_device_train_batch_size", "2",
         "--gradient_accumulation_steps", "1", "--max_completion_length", "24", "--learning_rate", "1e-4",
         "--save_strategy", "no", "--use_vllm", "true", "--vllm_mode", mode, "--vllm_max_model_length", "2048",
         "--report_to", "none", "--disable_tqdm", "true"]
    if base_url:
        a += ["--vllm_server_base_url", base_url, "--vllm_server_timeout", "60"]
    return a


def _vllm_model(trainer):
    return trainer.vllm_generation.llm.llm_engine.model_executor.driver_worker.model_runner.model


def _logprob(llm, ids: list[int], n_prompt: int) -> float:
    from vllm import SamplingParams

    out = llm.generate([{"prompt_token_ids": ids}], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)
    lps = out[0].prompt_logprobs[n_prompt:]
    return float(sum(next(iter(d.values())).logprob for d in lps))


def colocate(model: str, out: str) -> dict:
    import torch
    from transformers import TrainerCallback

    from memgym.training.adrpo import build_trainer, parse_args

    rec = {"policy_at_begin": [], "vllm_at_end": []}

    class Probe(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            rec["policy_at_begin"].append(dict(trainer.model.named_parameters())[PARAM].detach().clone())

        def on_step_end(self, args, state, control, **kw):
            rec["vllm_at_end"].append(dict(_vllm_model(trainer).named_parameters())[PARAM].detach().clone())

    trainer = build_trainer(*parse_args(argv("colocate", model, out, None)), callbacks=[Probe()])
    gen = trainer.vllm_generation
    calls = {"vllm": 0, "completions": 0, "hf": 0}
    real_generate, real_hf = gen.generate, trainer.model.generate

    def counted(*a, **k):
        res = real_generate(*a, **k)
        calls["vllm"] += 1
        calls["completions"] += len(res[1])
        return res

    def hf(*a, **k):
        calls["hf"] += 1
        return real_hf(*a, **k)

    gen.generate, trainer.model.generate = counted, hf
    tok = trainer.processing_class
    prompt = tok.apply_chat_template([{"role": "user", "content": "Write one memory entry about Gina's store."}],
                                     add_generation_prompt=True, tokenize=False)
    ids_p = tok(prompt, add_special_tokens=False)["input_ids"]
    ids = ids_p + tok('{"operations": [{"action": "ADD", "memory": "Gina opened a store."}]}',
                      add_special_tokens=False)["input_ids"]
    before = _logprob(gen.llm, ids, len(ids_p))
    trl_sync_error = None
    try:  # TRL's own colocate sync (the policy still holds the engine's weights, so nothing changes)
        type(gen).sync_weights(gen)
    except AttributeError as e:
        trl_sync_error = str(e)
    trainer.train()
    policy_final = dict(trainer.model.named_parameters())[PARAM].detach().clone()
    gen.sync_weights()  # what TRL runs before the next step's rollouts
    vllm_final = dict(_vllm_model(trainer).named_parameters())[PARAM].detach()
    after = _logprob(gen.llm, ids, len(ids_p))
    vdtype = vllm_final.dtype
    same = [bool(torch.equal(v, p.to(vdtype))) for v, p in zip(rec["vllm_at_end"], rec["policy_at_begin"])]
    moved = [float((rec["policy_at_begin"][i + 1] - rec["policy_at_begin"][i]).abs().max())
             for i in range(len(rec["policy_at_begin"]) - 1)]
    return {"steps": trainer.state.global_step, "calls": calls, "vllm_dtype": str(vdtype),
            "trl_sync_error": trl_sync_error,
            "vllm_equals_policy_at_step_begin": same, "policy_moved_between_steps": moved,
            "vllm_equals_final_policy_after_sync": bool(torch.equal(vllm_final, policy_final.to(vdtype))),
            "vllm_changed_since_step_0": bool(not torch.equal(vllm_final, rec["vllm_at_end"][0])),
            "logprob_before": before, "logprob_after": after,
            "rewards": [h["reward"] for h in trainer.state.log_history if "reward" in h]}


def _served_logprob(client) -> float:
    out = client.generate(["Gina opened a store. Memory:"], n=1, max_tokens=8, temperature=0.0)
    return float(sum(x[0] for x in out["logprobs"][0]))


def server(model: str, out: str, base_url: str) -> dict:
    """Build the trainer against the server; where that works (a GPU), train and compare the
    served greedy completion's log-probability before and after."""
    from memgym.training.adrpo import build_trainer, parse_args

    configs = parse_args(argv("server", model, out, base_url))
    try:
        trainer = build_trainer(*configs)
    except Exception as e:  # noqa: BLE001 - reported to the test, which asserts the exact failure
        frames = traceback.extract_tb(e.__traceback__)
        return {"error": type(e).__name__, "message": str(e),
                "frames": [f"{f.filename.rsplit('site-packages/', 1)[-1]}:{f.name}" for f in frames[-3:]]}
    client = trainer.vllm_generation.vllm_client
    before = _served_logprob(client)
    trainer.train()
    trainer.vllm_generation.sync_weights()
    return {"error": None, "steps": trainer.state.global_step, "logprob_before": before,
            "logprob_after": _served_logprob(client)}


if __name__ == "__main__":
    mode, model, out = sys.argv[1:4]
    res = colocate(model, out) if mode == "colocate" else server(model, out, sys.argv[4])
    print("ADRPO_RESULT " + json.dumps(res), flush=True)
