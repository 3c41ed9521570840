"""What a trained memory extractor learned, measured on data it never trained on.

Two measurements, both on real model calls (free decoding, greedy), both model-agnostic (any
extractor backend spec: ``hf:<dir>`` for a full checkpoint or a LoRA adapter, ``openai:``, ...):

- :func:`heldout_row`: memory construction over held-out conversations (e.g. LoCoMo conv-41
  and conv-42, first session), then top-k retrieval and answers for the QA whose evidence lies
  in those sessions. Per manager: the format-failure rate; the bank size (entries per part,
  core characters); the answer-recall of the retrieved memory (``rewards.scoring.metrics.answer_recall``,
  the share of each gold answer's stemmed tokens found in the top-k context, mean over QA);
  and the official LoCoMo F1 (``rewards.scoring.judge.F1Scorer``, LoCoMo's ``eval_question_answering``
  token F1) of one answer model's answers, the same answer model for every extractor.
- :func:`validation_reward`: the mean dense session reward (``rewards.session_reward``,
  MemBuilder arXiv 2601.05488 §3.4, R = g · acc · (1 − λ·LP)) of the extractor's greedy output
  for each validation row (conv-30's expert sessions: the prompt over the expert bank before the
  session, the counterfactual bank, the session's QA).

:class:`FormatTally` is the format-failure counter both use: one manager output is a failure
when :meth:`memory_bank.bank.MemoryBank.apply_text` rejects it (not JSON, not the manager's
schema, an id the bank lacks, cut off by the token limit); the rate is failures / outputs.
"""
from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from memory_bank.actions import MANAGERS
from memory_bank.bank import MemoryBank
from memory_bank.errors import ManagerOutputError


@dataclass
class FormatTally:
    """Counts manager outputs and format failures, per manager and per error type.

    ``attempts[m]`` / ``failures[m]``: outputs / rejected outputs of manager m; ``by_type``:
    failures per ``ManagerOutputError.error_type`` (e.g. ``invalid_json``, ``truncated``)."""

    attempts: dict[str, int] = field(default_factory=lambda: {m: 0 for m in MANAGERS})
    failures: dict[str, int] = field(default_factory=lambda: {m: 0 for m in MANAGERS})
    by_type: dict[str, int] = field(default_factory=dict)

    def add(self, manager: str, text: str, *, bank: MemoryBank | None = None, session: int = 1,
            finish_reason: str | None = None) -> str | None:
        """Count one output of ``manager``: applied to a copy of ``bank`` (default an empty
        bank; ``bank`` itself is never changed). Returns the error type of a failure, else None.
        Raises ValueError for an unknown manager."""
        if manager not in MANAGERS:
            raise ValueError(f"unknown manager {manager!r}; expected one of {MANAGERS}")
        self.attempts[manager] += 1
        trial = bank.copy() if bank is not None else MemoryBank()
        try:
            trial.apply_text(manager, text, session, finish_reason=finish_reason)
        except ManagerOutputError as e:
            self.failures[manager] += 1
            self.by_type[e.error_type] = self.by_type.get(e.error_type, 0) + 1
            return e.error_type
        return None

    def add_construction(self, built) -> None:
        """Add a :class:`memory_bank.construct.ConstructionResult`'s attempts and failures."""
        for m in MANAGERS:
            self.attempts[m] += built.attempts[m]
        for f in built.failures:
            self.failures[f.manager] += 1
            self.by_type[f.error_type] = self.by_type.get(f.error_type, 0) + 1

    def rate(self) -> dict[str, float | None]:
        """Per manager: failures / attempts in [0, 1]; None for a manager with no output."""
        return {m: (self.failures[m] / self.attempts[m] if self.attempts[m] else None) for m in MANAGERS}

    def overall(self) -> float | None:
        """All failures / all attempts (None when nothing was counted)."""
        n = sum(self.attempts.values())
        return sum(self.failures.values()) / n if n else None


def bank_size(bank: MemoryBank) -> dict[str, int]:
    """Entries per part (episodic, semantic, procedural) and ``core_chars`` (length of the core block)."""
    return {**bank.counts(), "core_chars": len(bank.core)}


def heldout_row(spec: str, convs, rt, *, answer_model: str = "hf:smollm2", top_k: int = 10,
                max_new_tokens: int = 640, answer_max_new_tokens: int = 24, progress: bool = False,
                segment_tokens: int | None = None) -> dict:
    """Build each conversation's bank with extractor ``spec``, answer its QA from the top-k
    retrieved memory with ``answer_model`` and score them with LoCoMo F1.

    ``convs``: :class:`memory_bank.schema.Conversation` objects already cut to the sessions to
    build (e.g. ``load_conversations(..., n_sessions=1)``, which keeps the QA whose evidence lies
    in them); ``rt``: a :class:`llm.runtime.Runtime`; ``segment_tokens``: build every session in
    segments of at most that many transcript tokens (the cut a model trained with
    ``training.sft_segments`` saw; None = whole sessions). Returns ``{"extractor", "format_failure_rate"
    (per manager), "format_failure_overall", "format_failures_by_type", "bank" (per conversation
    :func:`bank_size`), "bank_entries" (total over conversations), "answer_recall", "f1", "n_qa",
    "wall_s", "outputs"}`` (the raw manager outputs, per conversation and session)."""
    from data_synth.extractors import make_extractor
    from llm.base import GenerationParams
    from memory_bank.construct import construct
    from memory_bank.retrieval import BankRetriever
    from rewards.scoring.answer import answer_questions
    from rewards.scoring.judge import ScoreItem
    from rewards.scoring.metrics import answer_recall, mean_or_zero
    from rewards.scoring.scorers import make_scorer

    t0 = time.time()
    extractor = make_extractor(spec, rt, max_new_tokens, segment_tokens=segment_tokens)
    answerer = rt.backend(answer_model, role="answer")
    scorer = make_scorer("f1", dataset="locomo")
    tally, banks, outputs, f1s, recalls = FormatTally(), {}, {}, [], []
    for conv in convs:
        built = construct(conv, extractor, embedder=rt.embedder, progress=progress)
        tally.add_construction(built)
        banks[conv.id] = bank_size(built.bank)
        outputs[conv.id] = built.outputs
        if not conv.questions:
            continue
        retrieved = BankRetriever(built.bank, rt.embedder, top_k).retrieve([q.question for q in conv.questions])
        contexts = [r.render() for r in retrieved]
        preds = answer_questions(answerer, [(q.question, c, q.question_date) for q, c in zip(conv.questions, contexts)],
                                 GenerationParams(max_new_tokens=answer_max_new_tokens))
        f1s += scorer.score([ScoreItem(q.question, q.answer, p, c, q.category, q.id, q.rubric)
                             for q, p, c in zip(conv.questions, preds, contexts)])
        recalls += [answer_recall(q.answer, c) for q, c in zip(conv.questions, contexts)]
    return {"extractor": spec, "format_failure_rate": tally.rate(), "format_failure_overall": tally.overall(),
            "format_failures_by_type": dict(sorted(tally.by_type.items())), "bank": banks,
            "bank_entries": sum(sum(v for k, v in b.items() if k != "core_chars") for b in banks.values()),
            "answer_recall": mean_or_zero(recalls), "f1": mean_or_zero([float(x) for x in f1s]), "n_qa": len(f1s),
            "segment_tokens": segment_tokens, "wall_s": round(time.time() - t0, 1), "outputs": outputs}


def validation_samples(trajectories: Sequence[str], *, sessions: Sequence[int] | None, max_prompt_tokens: int | None,
                       tokenizer, embedder, managers: Sequence[str] = MANAGERS, segment_tokens: int | None = None):
    """The reward rows of the validation trajectories (``training.adrpo_data.select_samples``
    over ``rewards.samples.build_reward_samples``, or over segment rows
    ``training.segment_samples.segment_reward_samples`` when ``segment_tokens`` is set), as
    ADRPO builds its training rows."""
    from training.adrpo import trajectory_paths
    from training.adrpo_data import select_samples
    from training.segment_samples import reward_rows

    samples = reward_rows(trajectory_paths(trajectories), tokenizer=tokenizer, embedder=embedder, managers=managers,
                          segment_tokens=segment_tokens)
    return select_samples(samples, sessions=sessions, max_prompt_tokens=max_prompt_tokens, tokenizer=tokenizer)


def validation_reward(spec: str, samples, reward, rt, *, max_new_tokens: int = 640) -> dict:
    """Mean session reward of extractor ``spec``'s greedy output on each row of ``samples``.

    ``reward``: a :class:`rewards.session_reward.SessionReward` (its config says the mode, the
    judge, λ); a completion cut by ``max_new_tokens`` scores as a ``truncated`` failure (gate 0).
    Returns ``{"extractor", "reward" (mean over rows, in [0, 1]), "gate", "acc", "lp" (means),
    "by_manager" ({m: mean reward}), "format_failure_rate" (per manager, :class:`FormatTally`
    over the same outputs applied to each row's expert bank), "n", "do_nothing"
    (:func:`do_nothing_reward` on the same rows)}``."""
    from llm.base import GenerationParams
    from rewards.scoring.metrics import mean_or_zero

    backend = rt.backend(spec, role="extractor")
    comps = backend.generate([s.messages for s in samples], GenerationParams(max_new_tokens=max_new_tokens))
    bds = reward(list(samples), [c.text for c in comps], finish_reasons=[c.finish_reason for c in comps])
    tally = FormatTally()
    for s, c in zip(samples, comps):
        tally.add(s.manager, c.text, bank=s.bank_before, session=s.session, finish_reason=c.finish_reason)
    by_manager = {m: mean_or_zero([b.reward for s, b in zip(samples, bds) if s.manager == m])
                  for m in MANAGERS if any(s.manager == m for s in samples)}
    return {"extractor": spec, "reward": mean_or_zero([b.reward for b in bds]),
            "gate": mean_or_zero([b.gate for b in bds]), "acc": mean_or_zero([b.acc for b in bds]),
            "lp": mean_or_zero([b.lp for b in bds]), "by_manager": by_manager,
            "format_failure_rate": tally.rate(), "n": len(samples), "do_nothing": do_nothing_reward(samples, reward)}


def do_nothing_reward(samples, reward) -> dict:
    """The reference a validation reward must be read against: the mean reward of the outputs
    that change nothing (``rewards.audit.EMPTY_OUTPUTS``) on the same rows, ``{"reward", "by_manager"}``.
    With the counterfactual bank the other parts are the expert's, so an empty output already
    scores the questions those parts answer (e.g. 0.882 on conv-30's segment rows of sessions
    1-2, vs 0.934 for the expert's own outputs)."""
    from rewards.audit import EMPTY_OUTPUTS
    from rewards.scoring.metrics import mean_or_zero

    bds = reward(list(samples), [EMPTY_OUTPUTS[s.manager] for s in samples])
    return {"reward": mean_or_zero([b.reward for b in bds]),
            "by_manager": {m: mean_or_zero([b.reward for s, b in zip(samples, bds) if s.manager == m])
                           for m in MANAGERS if any(s.manager == m for s in samples)}}


def core_copy_stats(outputs: dict[str, list[dict[str, str]]], convs, n: int = 6) -> dict:
    """Verbatim-copy rate (:func:`rewards.copying.copy_rate`, n-gram length ``n``) of the core
    outputs that write text, against the transcripts of the sessions they were built from.

    ``outputs``: :func:`heldout_row`'s ``"outputs"`` (``{conversation id: [{manager: raw output}]}``,
    one dict per construction step); ``convs``: the same :class:`memory_bank.schema.Conversation`
    objects (cut to the sessions built). A core output counts when it parses
    (:func:`memory_bank.actions.parse_core`) to an APPEND / REPLACE / REWRITE with text; failed
    and NONE outputs write nothing and are left out. The source is every built session's
    transcript of that conversation (a segment's text is a part of it) and the output's own
    earlier words; the core block before the step is not replayed, so an APPEND that repeats it
    is not counted (the training reward counts it, ``SessionReward._copy_rates``).

    Returns ``{"mean", "max"}`` (in [0, 1], None when no output writes text) and ``"n"`` (writing
    outputs). Raises KeyError when ``outputs`` names a conversation ``convs`` lacks.
    Reference (measured, issue 17): the expert's conv-26 segment core writes 0.044.
    """
    from memory_bank.actions import parse_core
    from memory_bank.errors import ManagerOutputError
    from rewards.copying import copy_rate
    from rewards.length import core_written_text

    by_id = {c.id: c for c in convs}
    rates = []
    for cid, steps in outputs.items():
        source = [s.transcript() for s in by_id[cid].sessions]
        for step in steps:
            text = step.get("core")
            if not text:
                continue
            try:
                written = core_written_text(parse_core(text))
            except ManagerOutputError:
                continue
            if written.strip():
                rates.append(copy_rate(written, source, n))
    return {"mean": sum(rates) / len(rates) if rates else None, "max": max(rates) if rates else None, "n": len(rates)}
