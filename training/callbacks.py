""":class:`RunCardCallback` writes the run card of a training run beside ``trainer_state.json``.

:class:`MemoryEvalCallback`, a ``TrainerCallback`` for SFT and ADRPO that measures the model
being trained at each evaluation (greedy, same process) and appends one row to
``state.log_history``: ``memory_eval/validation_reward`` (with ``/gate``, ``/acc``, ``/lp``;
the dense session reward, MemBuilder arXiv 2601.05488 §3.4), ``memory_eval/format_failure/<m>``
in [0, 1], and for held-out conversations ``memory_eval/heldout_format_failure/<m>``,
``memory_eval/heldout_entries`` and ``memory_eval/heldout_answer_recall``.
Cost per evaluation: one batched generation of ``len(rows)`` prompts plus four outputs per
held-out segment, each at most ``max_new_tokens`` tokens.
"""
from __future__ import annotations

import copy
import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field

from transformers import TrainerCallback

from memgym.memory_bank.schema import Conversation
from memgym.training.metrics import FormatTally

PREFIX = "memory_eval"


def first_turns(conv: Conversation, n_turns: int) -> Conversation:
    """``conv`` cut to its first session's first ``n_turns`` turns, with the QA whose evidence
    lies wholly in them (a held-out set small enough to build at every evaluation)."""
    s = conv.sessions[0]
    kept = dataclasses.replace(s, turns=s.turns[:n_turns])
    ids = {t.id for t in kept.turns}
    qa = tuple(q for q in conv.questions if q.evidence and set(q.evidence) <= ids)
    return dataclasses.replace(conv, sessions=(kept,), questions=qa)


class MemoryEvalCallback(TrainerCallback):
    """Logs the validation reward, format failures and held-out answer-recall at each evaluation.

    ``tokenizer``: the policy's (copied, left padding); ``embedder``: for the held-out bank;
    ``segment_tokens``: held-out build segment size; ``top_k``: entries retrieved per question.
    Raises ValueError when there is nothing to measure.
    """

    def __init__(self, rows: Sequence, reward, tokenizer, *, embedder, heldout: Sequence[Conversation] = (),
                 segment_tokens: int | None = None, max_new_tokens: int = 192, top_k: int = 10,
                 batch_size: int = 8):
        if not rows and not heldout:
            raise ValueError("MemoryEvalCallback: no validation rows and no held-out conversation to measure")
        self.rows, self.reward, self.embedder = list(rows), reward, embedder
        self.tokenizer = copy.deepcopy(tokenizer)
        self.heldout, self.segment_tokens = list(heldout), segment_tokens
        self.max_new_tokens, self.top_k, self.batch_size = max_new_tokens, top_k, batch_size
        self._measured: set[int] = set()
        self._trainer = None

    def measure(self, model, step: int) -> dict[str, float]:
        """The logged values for ``model`` as it is now (keys under ``memory_eval/``)."""
        from memgym.llm.base import GenerationParams
        from memgym.llm.hf_backend import HFBackend

        was_training = model.training
        backend = HFBackend(model, self.tokenizer, device=str(model.device), batch_size=self.batch_size,
                            model_id=f"training-step-{step}")
        params = GenerationParams(max_new_tokens=self.max_new_tokens, temperature=0)
        try:
            out = self._validation(backend, params) if self.rows else {}
            if self.heldout:
                out.update(self._heldout(backend, params))
        finally:
            model.train(was_training)
        return out

    def _validation(self, backend, params) -> dict[str, float]:
        comps = backend.generate([s.messages for s in self.rows], params)
        bds = self.reward(self.rows, [c.text for c in comps], finish_reasons=[c.finish_reason for c in comps])
        tally = FormatTally()
        for s, c in zip(self.rows, comps):
            tally.add(s.manager, c.text, bank=s.bank_before, session=s.session, finish_reason=c.finish_reason)
        n = len(bds)
        out = {f"{PREFIX}/validation_reward": sum(b.reward for b in bds) / n,
               f"{PREFIX}/validation_gate": sum(b.gate for b in bds) / n,
               f"{PREFIX}/validation_acc": sum(b.acc for b in bds) / n,
               f"{PREFIX}/validation_lp": sum(b.lp for b in bds) / n, f"{PREFIX}/validation_rows": float(n)}
        out.update({f"{PREFIX}/format_failure/{m}": r for m, r in tally.rate().items() if r is not None})
        return out

    def _heldout(self, backend, params) -> dict[str, float]:
        from memgym.memory_bank.construct import ModelExtractor, construct
        from memgym.memory_bank.retrieval import retrieve
        from memgym.rewards.scoring.measure import measure
        from memgym.rewards.scoring.scorers import make_scorer
        from memgym.rewards.scoring.summary import QuestionResult, summarise

        extractor = ModelExtractor(backend, params, name=backend.model_id, segment_tokens=self.segment_tokens)
        scorer = make_scorer("answer-recall")
        tally, rows, entries = FormatTally(), [], 0
        for conv in self.heldout:
            built = construct(conv, extractor, embedder=self.embedder)
            tally.add_construction(built)
            entries += sum(built.bank.counts().values())
            if conv.questions:
                contexts = [r.render() for r in retrieve(built.bank, [q.question for q in conv.questions],
                                                         self.embedder, self.top_k)]
                scores = measure(scorer, list(conv.questions), contexts).scores
                rows += [QuestionResult(conv.id, q, None, None, s) for q, s in zip(conv.questions, scores)]
        summary = summarise(None, rows)
        out = {f"{PREFIX}/heldout_format_failure/{m}": r for m, r in tally.rate().items() if r is not None}
        out[f"{PREFIX}/heldout_entries"] = float(entries)
        out[f"{PREFIX}/heldout_qa"] = float(summary["n"])
        out[f"{PREFIX}/heldout_answer_recall"] = summary["overall"]
        return out

    def bind(self, trainer) -> None:
        """Measure ``trainer``'s model as the trainer holds it (see :meth:`on_evaluate` for ZeRO-3)."""
        self._trainer = trainer

    def _zero3(self) -> bool:
        trainer = self._trainer
        plugin = trainer.accelerator.state.deepspeed_plugin if trainer is not None else None
        return plugin is not None and plugin.zero_stage == 3

    def on_evaluate(self, args, state, control, model=None, **kwargs):
        """Measure once per evaluation step (a trainer with several eval splits calls this once per
        split) and log on the main process. Elsewhere the main process measures alone. Under
        DeepSpeed ZeRO-3 (a bound trainer) every process measures the same rows: each enters TRL's
        ``unwrap_model_for_generation`` (the block ``GRPOTrainer`` generates in: gathers the shards,
        lifts the per-module fetch/release hooks), but the engine's start-of-forward hook stays, and
        while it records a module trace it compares the trace across processes, a collective
        (DeepSpeed ``PartitionedParameterCoordinator.reset_step``): no process may run forwards alone. :func:`memgym.training.common.outside_zero3` keeps ``generate``
        from stepping in lockstep; an LLM judge gets each scoring request once per process."""
        if model is None or state.global_step in self._measured:
            return
        zero3 = self._zero3()
        if not (zero3 or state.is_world_process_zero):
            return
        self._measured.add(state.global_step)
        if zero3:
            from trl.models import unwrap_model_for_generation

            from memgym.training.common import outside_zero3

            trainer = self._trainer
            with unwrap_model_for_generation(trainer.model_wrapped, trainer.accelerator) as whole, \
                    outside_zero3(trainer.args):
                values = self.measure(whole, state.global_step)
        else:
            values = self.measure(model, state.global_step)
        if not state.is_world_process_zero:
            return
        state.log_history.append({**{k: round(float(v), 6) for k, v in values.items()}, "step": state.global_step})
        print(f"[{PREFIX} step {state.global_step}] " + ", ".join(
            f"{k.split('/', 1)[1]} {v:.3f}" for k, v in values.items()), flush=True)


def bind_memory_eval(trainer):
    """Bind each :class:`MemoryEvalCallback` of ``trainer`` to it (:meth:`MemoryEvalCallback.bind`);
    returns ``trainer``."""
    for cb in trainer.callback_handler.callbacks:
        if isinstance(cb, MemoryEvalCallback):
            cb.bind(trainer)
    return trainer


class RunCardCallback(TrainerCallback):
    """Writes ``<output_dir>/run_card.json`` (:func:`memgym.llm.runcard.build_card`, beside
    ``trainer_state.json``) when training begins, so a run that dies still has one, and again
    when it ends, with the wall time; main process only. ``configs``: the recipe's dataclasses
    (their fields, merged, are the card's recipe); ``models``: role -> spec (``policy`` given as
    ``model_name_or_path``: ``smollm2`` or a dir); ``runtime``: the reward's, whose counts are the cost."""

    def __init__(self, configs: Sequence, models: dict[str, str | None], runtime=None):
        self.configs, self.runtime = list(configs), runtime
        self.models = {r: (f"hf:{s}" if r in ("policy", "init_from") and s else s) for r, s in models.items()}
        self.card: dict | None = None
        self._t0 = None

    def write(self, output_dir: str, wall_s: float | None = None) -> dict:
        """Build the card and write it as ``output_dir/run_card.json``; returns it."""
        import json
        import time
        from pathlib import Path

        from memgym.llm.runcard import build_card

        recipe: dict = {}
        for c in self.configs:
            recipe.update(c.to_dict() if hasattr(c, "to_dict") else dataclasses.asdict(c))
        self.card = build_card(recipe=json.loads(json.dumps(recipe, default=str)), models=self.models,
                               runtime=self.runtime, wall_s=wall_s)
        out = Path(output_dir)
        out.mkdir(parents=True, exist_ok=True)
        tmp = out / f".run_card.json.{time.time_ns()}"
        tmp.write_text(json.dumps(self.card, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        tmp.replace(out / "run_card.json")
        return self.card

    def on_train_begin(self, args, state, control, **kwargs):
        import time

        self._t0 = time.time()
        if state.is_world_process_zero:
            self.write(args.output_dir)

    def on_train_end(self, args, state, control, **kwargs):
        import time

        if state.is_world_process_zero:
            self.write(args.output_dir, round(time.time() - self._t0, 2) if self._t0 else None)


@dataclass
class MemoryEvalFields:
    """Recipe fields of the in-trainer measurement, shared by the SFT and ADRPO recipes."""

    memory_eval_trajectories: list[str] = field(default_factory=list, metadata={
        "help": "validation reward rows from these expert trajectories (files or names in $MEMGYM_DATA/expert, e.g. "
                "conv-30), measured at every evaluation (memgym.training.callbacks); empty = no validation reward"})
    memory_eval_sessions: list[int] | None = field(default=None, metadata={
        "help": "validation rows of these session indices only (null: all)"})
    memory_eval_rows: int | None = field(default=None, metadata={
        "help": "the first N validation rows (in trajectory order; null: all)"})
    memory_eval_heldout: list[str] = field(default_factory=list, metadata={
        "help": "LoCoMo conversations the model builds a bank over at every evaluation (held-out answer-recall); "
                "empty = none"})
    memory_eval_heldout_turns: int | None = field(default=None, metadata={
        "help": "build only the first N turns of the held-out conversations' first session, with the QA whose "
                "evidence lies in them (null: the whole first session)"})
    memory_eval_max_new_tokens: int = field(default=192, metadata={
        "help": "tokens per greedy manager output of the measurement"})

    def memory_eval_on(self) -> bool:
        return bool(self.memory_eval_trajectories or self.memory_eval_heldout)

    def validation_rows(self, tokenizer, embedder, *, segment_tokens: int | None,
                        max_prompt_tokens: int | None = None) -> list:
        """The validation reward rows of ``memory_eval_trajectories`` (every manager), built as
        ADRPO builds its training rows (:func:`memgym.training.reward_rows.reward_rows`); [] for none."""
        from memgym.training.reward_rows import reward_rows

        if not self.memory_eval_trajectories:
            return []
        return reward_rows(self.memory_eval_trajectories, tokenizer=tokenizer, embedder=embedder,
                           segment_tokens=segment_tokens, sessions=self.memory_eval_sessions,
                           max_prompt_tokens=max_prompt_tokens, first=self.memory_eval_rows)


def build_memory_eval(cfg: MemoryEvalFields, rows: Sequence, tokenizer, embedder, reward, *,
                      segment_tokens: int | None):
    """The :class:`MemoryEvalCallback` of the recipe's ``memory_eval_*`` fields over ``rows`` (the
    validation rows: :meth:`MemoryEvalFields.validation_rows`), None when they ask for nothing."""
    from memgym.data_synth.datasets import load_conversations

    if not cfg.memory_eval_on():
        return None
    heldout = []
    if cfg.memory_eval_heldout:
        heldout = load_conversations("locomo", None, ids=list(cfg.memory_eval_heldout), n_sessions=1)
        if cfg.memory_eval_heldout_turns:
            heldout = [first_turns(c, cfg.memory_eval_heldout_turns) for c in heldout]
    return MemoryEvalCallback(rows, reward, tokenizer, embedder=embedder, heldout=heldout,
                              segment_tokens=segment_tokens, max_new_tokens=cfg.memory_eval_max_new_tokens)
