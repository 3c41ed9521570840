"""ADRPO dataset rows: one per (conversation, session, manager), holding TRL's ``prompt`` and
the ``key`` of its :class:`memgym.rewards.samples.RewardSample` in the trainer's table.
"""
from __future__ import annotations

import logging
import warnings
from collections.abc import Sequence

from memgym.llm.errors import MemgymError
from memgym.rewards.samples import RewardSample

logger = logging.getLogger(__name__)


class ADRPODataError(MemgymError, ValueError):
    """Bad ADRPO rows: duplicate keys, no rows left, or a joint-mode session missing a manager."""

    kind = "data"


def sample_table(samples: Sequence[RewardSample]) -> dict[str, RewardSample]:
    """key → sample. Raises :class:`ADRPODataError` naming the first duplicated key."""
    table: dict[str, RewardSample] = {}
    for s in samples:
        if s.key in table:
            raise ADRPODataError(f"duplicate reward sample key {s.key!r}")
        table[s.key] = s
    return table


def prompt_tokens(tokenizer, messages: list[dict]) -> int:
    """Tokens of ``messages`` rendered with the tokenizer's chat template and the generation
    prompt, exactly as TRL feeds them to the policy (special tokens of the template included)."""
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
    if isinstance(ids, dict) or hasattr(ids, "keys"):  # transformers 5 returns a BatchEncoding
        ids = ids["input_ids"]
    return len(ids)


def select_samples(samples: Sequence[RewardSample], *, sessions: Sequence[int] | None = None,
                   max_prompt_tokens: int | None = None, tokenizer=None,
                   whole_sessions: bool = False, keys: Sequence[str] | None = None) -> list[RewardSample]:
    """Filter samples, keeping their order: by ``keys`` (a key no sample has raises
    :class:`ADRPODataError`), ``sessions`` (1-based), ``max_prompt_tokens`` (longer rendered
    prompts are dropped, one warning; needs ``tokenizer``) and ``whole_sessions`` (joint mode:
    drop sessions missing a manager). Raises :class:`ADRPODataError` when nothing is left,
    ValueError for ``max_prompt_tokens`` without a tokenizer.
    """
    if keys is not None:
        have_keys = {s.key for s in samples}
        missing = [k for k in keys if k not in have_keys]
        if missing:
            raise ADRPODataError(f"ADRPO row_keys: {missing} match no row of the trajectories (keys look like "
                                 f"{sorted(have_keys)[:2]})")
        samples = [s for s in samples if s.key in set(keys)]
    kept = [s for s in samples if sessions is None or s.session in set(sessions)]
    if max_prompt_tokens is not None:
        if tokenizer is None:
            raise ValueError("select_samples: max_prompt_tokens needs the policy tokenizer")
        before = len(kept)
        kept = [s for s in kept if prompt_tokens(tokenizer, s.messages) <= max_prompt_tokens]
        if len(kept) < before:
            warnings.warn(f"ADRPO: dropped {before - len(kept)} of {before} rows whose prompt exceeds "
                          f"max_prompt_tokens={max_prompt_tokens}", stacklevel=2)
    if whole_sessions:
        from memgym.memory_bank.actions import MANAGERS

        have: dict[tuple[str, int], set[str]] = {}
        for s in kept:
            have.setdefault(s.unit, set()).add(s.manager)
        kept = [s for s in kept if have[s.unit] == set(MANAGERS)]
    if not kept:
        raise ADRPODataError("ADRPO: no training rows left after filtering (sessions="
                             f"{list(sessions) if sessions is not None else 'all'}, keys={keys}, "
                             f"max_prompt_tokens={max_prompt_tokens}, whole_sessions={whole_sessions})")
    return kept


def rows_from_samples(samples: Sequence[RewardSample]) -> list[dict]:
    """One dict per sample: ``prompt`` (the chat messages, copied),
    ``key``, ``conversation_id``, ``session`` (int), ``manager``. For joint mode the caller
    keeps the four managers of a session adjacent (the builder's order already does)."""
    return [{"prompt": [dict(m) for m in s.messages], "key": s.key, "conversation_id": s.conversation_id,
             "session": int(s.session), "manager": s.manager} for s in samples]


def build_dataset(samples: Sequence[RewardSample]):
    """A ``datasets.Dataset`` of :func:`rows_from_samples` (checks keys are unique)."""
    from datasets import Dataset

    sample_table(samples)
    return Dataset.from_list(rows_from_samples(samples))


def session_block_sampler(dataset, *, block: int, mini_repeat_count: int, batch_size: int, repeat_count: int,
                          shuffle: bool, seed: int | None):
    """TRL's ``RepeatSampler`` shuffled by whole sessions (``block`` adjacent rows each), for joint
    mode. Raises :class:`ADRPODataError` when ``batch_size`` or ``len(dataset)`` is not a
    multiple of ``block``.
    """
    import torch
    from trl.trainer.utils import RepeatSampler

    if len(dataset) % block:
        raise ADRPODataError(f"joint mode: {len(dataset)} rows is not a multiple of {block} managers per session")
    if batch_size % block:
        raise ADRPODataError(f"joint mode: the generation batch holds {batch_size} unique prompts, not a multiple of "
                             f"{block}; set generation_batch_size = num_generations x a multiple of {block}")

    class _SessionBlockSampler(RepeatSampler):
        def __iter__(self):
            n_blocks = self.num_samples // block
            order = (torch.randperm(n_blocks, generator=self.generator).tolist() if self.shuffle
                     else list(range(n_blocks)))
            indexes = [b * block + j for b in order for j in range(block)]
            chunks = [indexes[i: i + self.batch_size] for i in range(0, len(indexes), self.batch_size)]
            for chunk in (c for c in chunks if len(c) == self.batch_size):
                for _ in range(self.repeat_count):
                    for index in chunk:
                        for _ in range(self.mini_repeat_count):
                            yield index

    return _SessionBlockSampler(dataset, mini_repeat_count=mini_repeat_count, batch_size=batch_size,
                                repeat_count=repeat_count, shuffle=shuffle, seed=seed)


def screen_rows(rows: Sequence[RewardSample], reward, backend, *, n: int, num_generations: int, max_new_tokens: int,
                temperature: float, top_p: float, seed: int) -> tuple[list[RewardSample], list[dict]]:
    """The first ``n`` of ``rows`` whose ``num_generations`` rollouts from ``backend`` get rewards
    of nonzero spread (a zero-spread group has advantage 0: Shao et al. 2024, GRPO, Eq. 3).
    Returns ``(chosen rows, screen)`` with one ``{"key", "rewards"}`` per row tried. Raises
    :class:`ADRPODataError` when no row has spread.
    """
    import numpy as np

    from memgym.llm.base import GenerationParams

    chosen, screen = [], []
    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, seed=seed)
    for s in rows:
        comps = backend.generate([s.messages] * num_generations, params)
        bds = reward([s] * num_generations, [c.text for c in comps], finish_reasons=[c.finish_reason for c in comps])
        rewards = [round(float(b.reward), 6) for b in bds]
        screen.append({"key": s.key, "rewards": rewards})
        logger.info("ADRPO screen %s: rewards %s", s.key, rewards)
        if not np.isclose(np.std(rewards), 0.0):
            chosen.append(s)
            if len(chosen) >= n:
                break
    if not chosen:
        raise ADRPODataError(f"ADRPO screen_rows: none of the {len(screen)} rows tried got rollouts with different "
                             f"rewards ({num_generations} each); widen the rows (sessions, managers) or raise "
                             "temperature")
    return chosen, screen
