"""``ADRPOTrainer``: TRL's ``GRPOTrainer`` with the dense session reward and contribution-aware
weighting: each completion's advantage is multiplied by w(m) after
``_generate_and_score_completions`` (as TRL's MiniLLM trainer edits advantages) and TRL's own
loss does the rest. Source: MemBuilder (arXiv 2601.05488) §3.4; docs/design.md § "Dense session reward and ADRPO", step 7.

Logs ``reward_parts/*`` means, ``dominant/*`` counts, ``adrpo/weight_mean`` and
``frac_reward_zero_std/<mode>`` beside TRL's own logs.

``use_vllm`` with ``vllm_mode: colocate`` on vLLM's CPU build: the weights reach the engine
through vLLM's in-place reload (:func:`reload_colocated_weights`) instead of TRL's per-tensor
``load_weights``, which that build cannot take after start-up.
"""
from __future__ import annotations

from collections.abc import Sequence

import torch
from trl import GRPOTrainer

from memgym.rewards.samples import RewardSample
from memgym.training.adrpo_config import ADRPOConfig, ADRPOConfigError
from memgym.training.adrpo_data import build_dataset, sample_table, session_block_sampler

PART_NAMES = ("episodic", "semantic", "procedural", "none")
LOGGED_PARTS = ("reward", "gate", "acc", "lp", "weight", "format_error", "frac_correct", "copy")


def _completion_text(completion) -> str:
    """TRL passes a conversational completion as ``[{"role": "assistant", "content": s}]``."""
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list) and completion and isinstance(completion[-1], dict):
        content = completion[-1].get("content", "")
        if isinstance(content, list):  # structured content parts
            return "".join(p.get("text", "") for p in content if isinstance(p, dict))
        return content if isinstance(content, str) else ""
    raise TypeError(f"ADRPO reward: cannot read a completion of type {type(completion).__name__}")


class SessionRewardFunction:
    """The TRL reward function: one session-reward call per generation batch, one float in [0, 1]
    per completion (rows looked up by ``key`` in ``table``). ``rollout_offset`` (set by the
    trainer) makes ``rollout_index = (offset + i) mod num_generations``; a completion not ending
    in one of ``stop_token_ids`` is scored as ``truncated``; ``breakdowns`` holds the last batch's.
    Raises KeyError for an unknown key, ValueError for a wrong reward count.
    """

    __name__ = "session_reward"

    def __init__(self, reward, table: dict[str, RewardSample], num_generations: int):
        self.reward, self.table, self.num_generations = reward, table, num_generations
        self.rollout_offset = 0
        self.breakdowns: list = []
        self.stop_token_ids: set[int] | None = None

    def finish_reasons(self, completion_ids) -> list[str] | None:
        """``"length"`` for each completion that did not end on a stop token, else ``"stop"``;
        None when the token ids or the stop ids are unknown."""
        if completion_ids is None or not self.stop_token_ids:
            return None
        return ["length" if len(ids) and int(ids[-1]) not in self.stop_token_ids else "stop"
                for ids in completion_ids]

    def __call__(self, prompts, completions, key=None, completion_ids=None, **kwargs) -> list[float]:
        if key is None:
            raise KeyError("ADRPO reward: the batch has no 'key' column (rows must come from memgym.training.adrpo_data)")
        missing = [k for k in key if k not in self.table]
        if missing:
            raise KeyError(f"ADRPO reward: unknown sample key {missing[0]!r} ({len(missing)} unknown)")
        samples = [self.table[k] for k in key]
        texts = [_completion_text(c) for c in completions]
        group = self.num_generations
        rollout_index = [(self.rollout_offset + i) % group for i in range(len(texts))]
        reasons = self.finish_reasons(completion_ids)
        out = (self.reward(samples, texts, rollout_index=rollout_index) if reasons is None
               else self.reward(samples, texts, rollout_index=rollout_index, finish_reasons=reasons))
        if len(out) != len(texts):
            raise ValueError(f"ADRPO reward returned {len(out)} breakdowns for {len(texts)} completions")
        self.breakdowns = list(out)
        log_metric = kwargs.get("log_metric")
        stats = getattr(self.reward, "last_stats", None) or {}
        if log_metric is not None:  # failures that score 0 without being wrong answers
            for k in ("judge_unparsable", "empty_answers"):
                if k in stats:
                    log_metric(f"reward_failures/{k}", float(stats[k]))
            if reasons is not None:
                log_metric("reward_failures/truncated", float(sum(r == "length" for r in reasons)))
        log_extra = kwargs.get("log_extra")
        if log_extra is not None:
            log_extra("gate", [b.gate for b in out])
            log_extra("dominant", [b.dominant or "none" for b in out])
            log_extra("weight", [b.weight for b in out])
        return [float(b.reward) for b in out]


def reload_colocated_weights(generation) -> None:
    """Push the policy's weights into TRL's colocated vLLM engine with vLLM's in-place reload
    (``model_runner.reload_weights``: restore each layer, load, re-run its post-load processing),
    over TRL's own parameter walk (``VLLMGeneration._iter_named_params``: PEFT merge, DeepSpeed /
    FSDP gather, vLLM names), then reset the prefix cache as TRL does.

    Why: on vLLM's CPU platform every linear layer's weight is packed into a oneDNN / sgl-kernel
    handle after loading and the parameter replaced by an empty one without ``weight_loader``
    (vllm/model_executor/layers/linear.py, ``dispatch_cpu_unquantized_gemm(layer,
    remove_weight=True)``), so TRL's ``sync_weights`` (trl/generation/vllm_generation.py,
    ``model.load_weights([(name, param)])``) fails there with AttributeError: 'Parameter' object
    has no attribute 'weight_loader'."""
    runner = generation.llm.llm_engine.model_executor.driver_worker.model_runner
    runner.reload_weights(weights_iterator=generation._iter_named_params(), is_checkpoint_format=True)
    generation.llm.reset_prefix_cache()


class ADRPOTrainer(GRPOTrainer):
    """``GRPOTrainer`` with the session reward and contribution-aware weights.

    ``args``: :class:`ADRPOConfig` with ``weighting`` advantage or none; ``samples``: the
    :class:`RewardSample` rows (joint mode: each session's four rows adjacent); ``reward``: the
    :class:`memgym.rewards.session_reward.SessionReward` (its ``config.mode`` is the trainer's: joint
    mode keeps each session's four rows in one batch); ``eval_samples``: the eval set (None: none).
    Raises :class:`ADRPOConfigError` for ``weighting: unclipped`` or joint-mode batches that would
    split a session.
    """

    def __init__(self, model, *, args: ADRPOConfig, samples: Sequence[RewardSample], reward,
                 processing_class=None, peft_config=None, callbacks=None, eval_samples: Sequence[RewardSample] | None = None):
        if not isinstance(args, ADRPOConfig):
            raise ADRPOConfigError(f"ADRPOTrainer needs an ADRPOConfig, got {type(args).__name__}")
        if args.weighting == "unclipped" and type(self)._compute_loss is GRPOTrainer._compute_loss:
            raise ADRPOConfigError("weighting: unclipped (Eq. 12) needs its own loss: use "
                                   "memgym.training.adrpo_eq12.ADRPOEq12Trainer")
        self.mode = reward.config.mode
        if self.mode == "joint":
            per_process = args.per_device_train_batch_size * args.steps_per_generation
            if per_process % (4 * args.num_generations):
                raise ADRPOConfigError(
                    f"joint mode: each process scores {per_process} completions per generation batch, not a multiple "
                    f"of 4 managers x {args.num_generations} generations, so a session would be split")
        self.table = sample_table([*samples, *(eval_samples or [])])
        self.reward_fn = SessionRewardFunction(reward, self.table, args.num_generations)
        super().__init__(model, reward_funcs=[self.reward_fn], args=args, train_dataset=build_dataset(samples),
                         eval_dataset=build_dataset(eval_samples) if eval_samples else None,
                         processing_class=processing_class, peft_config=peft_config, callbacks=callbacks)
        pad = getattr(self._tokenizer, "pad_token_id", None)
        self.reward_fn.stop_token_ids = {int(t) for t in self.eos_token_ids} | ({int(pad)} if pad is not None else set())
        if self.use_vllm and args.vllm_mode == "colocate":
            from vllm.platforms import current_platform

            if current_platform.is_cpu():
                gen = self.vllm_generation
                gen.sync_weights = lambda: reload_colocated_weights(gen)

    def _get_train_sampler(self, dataset=None):
        if self.mode != "joint":
            return super()._get_train_sampler(dataset)
        return session_block_sampler(dataset if dataset is not None else self.train_dataset, block=4,
                                     mini_repeat_count=self.num_generations,
                                     batch_size=self.args.generation_batch_size // self.num_generations,
                                     repeat_count=self.num_iterations * self.args.steps_per_generation,
                                     shuffle=self.shuffle_dataset, seed=self.args.seed)

    def _generate_and_score_completions(self, inputs):
        """TRL's rollout and scoring, then w(m) per completion: ``advantages`` × w for
        ``weighting: advantage``; ``adrpo_weights`` (B,) beside them for ``unclipped``."""
        mode = "train" if self.model.training else "eval"
        self.reward_fn.rollout_offset = self.accelerator.process_index * len(inputs)
        self.reward_fn.breakdowns = []
        output = super()._generate_and_score_completions(inputs)
        bds = self.reward_fn.breakdowns
        if len(bds) != len(inputs):
            raise RuntimeError(f"ADRPO: the reward stashed {len(bds)} breakdowns for {len(inputs)} completions")
        adv = output["advantages"]
        w = torch.tensor([float(b.weight) for b in bds], dtype=adv.dtype, device=adv.device)
        if self.args.weighting == "advantage":
            output["advantages"] = adv * (w if adv.dim() == 1 else w.unsqueeze(1))
        elif self.args.weighting == "unclipped":
            output["adrpo_weights"] = w
        self._log_reward_parts(bds, mode, adv.device)
        return output

    def _log_reward_parts(self, bds, mode: str, device) -> None:
        """Sum the breakdowns' parts over all processes and append the means (parts and
        ``adrpo/weight_mean``) and counts (dominant parts) to TRL's metrics, which ``log``
        averages into ``state.log_history``."""
        logs = [b.to_log() for b in bds]
        names = [f"reward_parts/{p}" for p in LOGGED_PARTS] + [f"dominant/{p}" for p in PART_NAMES]
        sums = [sum(d[p] for d in logs) for p in LOGGED_PARTS] + [sum(d[f"dominant/{p}"] for d in logs)
                                                                   for p in PART_NAMES]
        local = torch.tensor(sums + [float(len(logs))], dtype=torch.float64, device=device)
        total = self.accelerator.gather(local.unsqueeze(0)).sum(dim=0).tolist()
        n = max(total[-1], 1.0)
        for i, name in enumerate(names):
            value = total[i] / n if name.startswith("reward_parts/") else total[i]
            self._metrics[mode][name].append(value)
        self._metrics[mode]["adrpo/weight_mean"].append(total[names.index("reward_parts/weight")] / n)
        zero_std = self._metrics[mode].get("frac_reward_zero_std")
        if zero_std:
            self._metrics[mode][f"frac_reward_zero_std/{self.mode}"].append(zero_std[-1])
