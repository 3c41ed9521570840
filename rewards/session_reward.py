"""The dense session-level reward of ADRPO with corrected contribution attribution.

Source: MemBuilder (arXiv 2601.05488) §3.4, Eqs. 5-10. For (conversation, session t,
manager m) and completion y:

1. Format gate g: 1 if y parses, validates and applies to the bank, else 0.
2. Bank: ``counterfactual`` = expert bank before t + expert's session-t ops with m's replaced
   by y; ``isolated`` = expert bank before t + y; ``joint`` = expert bank before t + the k-th
   rollouts of all four managers.
3. acc = mean_j judge(answer(q_j, retrieve(bank, q_j)), a_j) (:mod:`memgym.rewards.scoring.measure`).
4. LP in policy tokens (:mod:`memgym.rewards.length`).
5. R = g · acc · (1 − λ·LP) · (1 − μ·CP) (:mod:`memgym.rewards.copying`; μ = 0 is MemBuilder's).
6. w(m) = α for the dominant part, else 1 (:mod:`memgym.rewards.attribution`).

A call makes one ``embedder.encode``, one answer ``generate`` and one judge ``generate``;
identical (bank, session) pairs are scored once.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from memgym.llm.base import GenerationParams
from memgym.memory_bank.actions import MANAGERS, PARTS, CoreRewrite, parse_output
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.errors import ManagerOutputError
from memgym.memory_bank.retrieval import BankRetriever, Retrieved
from memgym.rewards.attribution import contribution_weight, dominant_part, part_counts
from memgym.rewards.copying import copy_rate, prompt_transcript
from memgym.rewards.length import core_length_penalty, core_written_text, count_tokens, part_length_penalty
from memgym.rewards.reward_types import MODES, RewardBreakdown, RewardDataError, SessionRewardConfig
from memgym.rewards.samples import RewardSample
from memgym.rewards.scoring.measure import measure
from memgym.rewards.scoring.scorers import make_scorer

#: The reward's public names: the computation and statistic defined here, and the settings,
#: result and error types of :mod:`memgym.rewards.reward_types` it takes and returns.
__all__ = ["MODES", "SessionRewardConfig", "RewardBreakdown", "SessionReward", "RewardDataError",
           "frac_reward_zero_std"]


def frac_reward_zero_std(rewards: Sequence[float], group_size: int) -> float:
    """Share in [0, 1] of consecutive groups of ``group_size`` rewards whose std is 0 (as
    ``torch.isclose(std, 0)`` in TRL's GRPOTrainer): such groups give no GRPO signal.
    Raises ValueError when ``len(rewards)`` is not a positive multiple of ``group_size``."""
    r = np.asarray(rewards, dtype=np.float64)
    if group_size < 1 or len(r) == 0 or len(r) % group_size:
        raise ValueError(f"frac_reward_zero_std: {len(r)} rewards do not split into groups of {group_size}")
    std = r.reshape(-1, group_size).std(axis=1)
    return float(np.mean(np.isclose(std, 0.0)))


class _LookupEmbedder:
    """Serves vectors computed by the batch's single encode call to :class:`BankRetriever`."""

    def __init__(self, table: dict[str, np.ndarray], dim: int):
        self.table, self.dim, self.calls = table, dim, 0

    def encode(self, texts):
        if not texts:
            return np.zeros((0, self.dim), dtype=np.float32)
        return np.stack([self.table[t] for t in texts])


@dataclass
class _Row:
    sample: RewardSample
    text: str
    finish_reason: str | None = None
    ops: object = None
    error_type: str | None = None
    bank_id: int | None = None


class SessionReward:
    """Callable reward: ``reward(samples, completions, rollout_index=None) -> breakdowns``.

    ``tokenizer``: the policy's (lengths in its tokens). ``answer_backend`` is needed by ``f1``
    and ``llm``, ``judge_backend`` by ``llm``. ``last_stats``: per-call counts of embeds,
    prompts, unique banks, empty answers, unparsable judge replies. Raises ValueError for a
    missing backend.
    """

    def __init__(self, config: SessionRewardConfig | None = None, *, embedder, tokenizer, answer_backend=None,
                 judge_backend=None, answer_params: GenerationParams | None = None):
        self.config = config or SessionRewardConfig()
        self.embedder = embedder
        self.tokenizer = tokenizer
        self.scorer = make_scorer(self.config.judge, judge_backend)
        if self.scorer.needs_prediction and answer_backend is None:
            raise ValueError(f"judge {self.config.judge!r} scores an answer: pass answer_backend")
        self.answer_backend = answer_backend
        self.answer_params = answer_params or GenerationParams(max_new_tokens=48, temperature=0)
        self._expert_ops: dict[tuple[str, int, int, str], object] = {}
        self._expert_len: dict[tuple[str, int, int, str], int] = {}
        self.last_stats: dict[str, int] = {}

    # ---- banks --------------------------------------------------------------------------
    def _expert(self, s: RewardSample, m: str):
        key = (*s.unit, m)
        if key not in self._expert_ops:
            try:
                self._expert_ops[key] = parse_output(m, s.expert_outputs[m])
            except (ManagerOutputError, KeyError) as e:
                raise RewardDataError(f"sample {s.key}: the expert output of {m} is unusable: {e}") from None
        return self._expert_ops[key]

    def _apply_expert(self, bank: MemoryBank, s: RewardSample, m: str) -> None:
        try:
            bank.apply(m, self._expert(s, m), s.session)
        except ManagerOutputError as e:
            raise RewardDataError(f"sample {s.key}: the expert output of {m} does not apply to its bank: {e}") from None

    @staticmethod
    def _try_apply(bank: MemoryBank, row: _Row) -> bool:
        s = row.sample
        try:
            if row.ops is None:
                row.ops = parse_output(s.manager, row.text, row.finish_reason)
            bank.apply(s.manager, row.ops, s.session)
            return True
        except ManagerOutputError as e:
            row.error_type = e.error_type
        except RecursionError:
            row.error_type = "parse_error"
        return False

    def _build_banks(self, rows: list[_Row], rollout_index) -> list[MemoryBank]:
        banks: list[MemoryBank] = []
        mode = self.config.mode
        if mode in ("counterfactual", "isolated"):
            for row in rows:
                s = row.sample
                bank = s.bank_before.copy()
                if not self._try_apply(bank, row):
                    continue
                if mode == "counterfactual":
                    for m in MANAGERS:
                        if m != s.manager:
                            self._apply_expert(bank, s, m)
                row.bank_id = len(banks)
                banks.append(bank)
            return banks
        groups: dict[tuple, list[_Row]] = {}
        for row, k in zip(rows, rollout_index):
            groups.setdefault((*row.sample.unit, k), []).append(row)
        for (conv, sess, _seg, k), members in groups.items():
            managers = sorted(r.sample.manager for r in members)
            if managers != sorted(MANAGERS):
                raise ValueError(f"joint mode needs exactly one row per manager {MANAGERS} for {conv} session {sess}, "
                                 f"rollout {k}; the batch has {managers}")
            bank = members[0].sample.bank_before.copy()
            for m in MANAGERS:
                row = next(r for r in members if r.sample.manager == m)
                self._try_apply(bank, row)  # an invalid rollout applies nothing (atomic)
            bank_id = len(banks)
            banks.append(bank)
            for row in members:
                if row.error_type is None:
                    row.bank_id = bank_id
        return banks

    # ---- lengths ------------------------------------------------------------------------
    def _lengths(self, rows: list[_Row]) -> list[tuple[float, int, int]]:
        """(LP, tokens measured, expert tokens measured) per row; ONE tokenizer call for the
        completions and the expert outputs not yet counted (expert counts are memoised)."""
        cfg = self.config
        texts = []
        for row in rows:
            if row.error_type is None and row.sample.manager == "core":
                texts.append(core_written_text(row.ops))
            else:
                texts.append(row.text if isinstance(row.text, str) else "")
        todo: dict[tuple, str] = {}
        for row in rows:
            s = row.sample
            key = (*s.unit, s.manager)
            if key not in self._expert_len and key not in todo:
                todo[key] = (core_written_text(self._expert(s, "core")) if s.manager == "core"
                             else s.expert_outputs[s.manager])
        counts = count_tokens(self.tokenizer, texts + list(todo.values()))
        self._expert_len.update(zip(todo, counts[len(texts):]))
        out = []
        for row, n in zip(rows, counts[: len(texts)]):
            s = row.sample
            n_e = self._expert_len[(*s.unit, s.manager)]
            if row.error_type is not None:
                lp = 0.0
            elif s.manager == "core":
                lp = core_length_penalty(n, cfg.core_lp_lo, cfg.core_lp_hi)
            else:
                lp = part_length_penalty(n, n_e, band_abs=cfg.band_abs_tokens, band_lo=cfg.band_lo,
                                         band_hi=cfg.band_hi, r_min=cfg.r_min, r_max=cfg.r_max)
            out.append((lp, n, n_e))
        return out

    def _copy_rates(self, rows: list[_Row]) -> list[float]:
        """CP per row against the prompt's transcript (and, for APPEND / REPLACE, the core block) and
        its own earlier words; 0.0 for other managers and invalid outputs. Raises
        :class:`RewardDataError` for a core prompt without transcript when the penalty is on.
        """
        cfg = self.config
        out = []
        for row in rows:
            s = row.sample
            if row.error_type is not None or s.manager != "core":
                out.append(0.0)
                continue
            try:
                source = prompt_transcript(s.messages)
            except ValueError as e:
                if cfg.copy_penalty > 0:
                    raise RewardDataError(f"sample {s.key}: copy_penalty {cfg.copy_penalty} needs the session "
                                          f"transcript in the prompt: {e}") from None
                out.append(0.0)
                continue
            sources = [source] if isinstance(row.ops, CoreRewrite) else [source, s.bank_before.core]
            out.append(copy_rate(core_written_text(row.ops), sources, cfg.copy_ngram))
        return out

    # ---- scoring ------------------------------------------------------------------------
    def _score_banks(self, jobs: list[tuple[MemoryBank, RewardSample]]) -> list[tuple[list[float], list[Retrieved]]]:
        """Retrieve, answer and judge the QA of each (bank, sample) job, batched."""
        texts: dict[str, None] = {}
        for bank, s in jobs:
            for p in PARTS:
                for e in bank.entries(p):
                    texts.setdefault(e.text)
            for q in s.qa:
                texts.setdefault(q.question)
        calls0 = getattr(self.embedder, "calls", 0)
        uniq = list(texts)
        vecs = self.embedder.encode(uniq) if uniq else np.zeros((0, self.embedder.dim), dtype=np.float32)
        self.last_stats["embed_calls"] = getattr(self.embedder, "calls", 0) - calls0
        lookup = _LookupEmbedder(dict(zip(uniq, vecs)), self.embedder.dim)
        retrieved = [BankRetriever(bank, lookup, self.config.retrieval_top_k).retrieve([q.question for q in s.qa])
                     for bank, s in jobs]
        flat = [(s, q, r) for (_, s), rs in zip(jobs, retrieved) for q, r in zip(s.qa, rs)]
        unparsable0 = getattr(self.scorer, "parse_failures", 0)
        measured = measure(self.scorer, [q for _, q, _ in flat], [r.render() for _, _, r in flat],
                           answerer=self.answer_backend, params=self.answer_params)
        preds, scores = measured.predictions, measured.scores
        self.last_stats["answer_prompts"] = len(flat) if self.scorer.needs_prediction else 0
        self.last_stats["judge_prompts"] = len(flat) if self.config.judge == "llm" else 0
        # answers that came back empty and judge replies with no CORRECT/WRONG label both score 0
        self.last_stats["empty_answers"] = sum(1 for p in preds if not p.strip()) if self.scorer.needs_prediction else 0
        self.last_stats["judge_unparsable"] = getattr(self.scorer, "parse_failures", 0) - unparsable0
        out, i = [], 0
        for (_, s), rs in zip(jobs, retrieved):
            out.append(([float(x) for x in scores[i: i + len(rs)]], rs))
            i += len(rs)
        return out

    def __call__(self, samples: list[RewardSample], completions: list[str],
                 rollout_index: list[int] | None = None,
                 finish_reasons: list[str | None] | None = None) -> list[RewardBreakdown]:
        """Score ``completions[i]`` as ``samples[i].manager``'s output; one breakdown per row.

        ``finish_reasons[i] == "length"`` is a ``truncated`` format failure. ``rollout_index``
        (required in joint mode) groups the four managers of each (session, k). Raises ValueError
        for mismatched lengths, a sample without QA or an incomplete joint group;
        :class:`RewardDataError` for expert data that does not apply.
        """
        if len(samples) != len(completions):
            raise ValueError(f"SessionReward: {len(samples)} samples but {len(completions)} completions")
        if finish_reasons is not None and len(finish_reasons) != len(completions):
            raise ValueError(f"SessionReward: {len(finish_reasons)} finish reasons for {len(completions)} completions")
        if self.config.mode == "joint":
            if rollout_index is None or len(rollout_index) != len(samples):
                raise ValueError("SessionReward: joint mode needs rollout_index, one k per row")
        for s in samples:
            if not isinstance(s, RewardSample):
                raise TypeError(f"SessionReward: expected RewardSample rows, got {type(s).__name__}")
            if not s.qa:
                raise ValueError(f"SessionReward: sample {s.key} has no QA to score")
        self.last_stats = {"embed_calls": 0, "answer_prompts": 0, "judge_prompts": 0, "unique_banks": 0,
                           "empty_answers": 0, "judge_unparsable": 0}
        rows = [_Row(s, y, r) for s, y, r in zip(samples, completions, finish_reasons or [None] * len(samples))]
        banks = self._build_banks(rows, rollout_index)
        lengths = self._lengths(rows)
        copies = self._copy_rates(rows)
        # identical (bank, session) pairs are scored once
        job_of_bank, jobs, seen = {}, [], {}
        for row in rows:
            if row.bank_id is None or row.bank_id in job_of_bank:
                continue
            key = (*row.sample.unit, banks[row.bank_id].dumps())
            if key not in seen:
                seen[key] = len(jobs)
                jobs.append((banks[row.bank_id], row.sample))
            job_of_bank[row.bank_id] = seen[key]
        self.last_stats["unique_banks"] = len(jobs)
        results = self._score_banks(jobs) if jobs else []
        cfg = self.config
        out = []
        for row, (lp, n, n_e), cp in zip(rows, lengths, copies):
            s = row.sample
            if row.bank_id is None:
                out.append(RewardBreakdown(0.0, 0, 0.0, lp, n, n_e, None, 1.0, {p: 0 for p in PARTS},
                                           row.error_type, cfg.mode, [False] * len(s.qa)))
                continue
            scores, retrieved = results[job_of_bank[row.bank_id]]
            correct = [x >= cfg.correct_threshold for x in scores]
            acc = float(np.mean(scores)) if scores else 0.0
            counts = part_counts(retrieved, correct if cfg.attribution_on == "correct" else None)
            dom = dominant_part(counts)
            out.append(RewardBreakdown(acc * (1.0 - cfg.lam * lp) * (1.0 - cfg.copy_penalty * cp), 1, acc, lp, n,
                                       n_e, dom, contribution_weight(s.manager, dom, cfg.alpha), counts, None,
                                       cfg.mode, correct, cp))
        return out
