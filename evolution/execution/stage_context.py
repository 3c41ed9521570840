"""What every stage of ONE program evaluation shares: :class:`StageContext` (counters, stage
hashes, helpers) and :class:`RunnerResources` (what a stage may use of its runner).
"""
from __future__ import annotations

import threading
from contextlib import AbstractContextManager
from typing import Protocol

from tqdm.auto import tqdm

from memgym.evolution.execution.component_diff import STAGES, stage_component_hashes
from memgym.rewards.scoring.context_budget import ContextBudget
from memgym.evolution.execution.settings import RunnerSettings
from memgym.evolution.execution.stage_cache import StageCache
from memgym.llm.base import Backend, Completion, GenerationParams
from memgym.llm.runtime import Runtime
from memgym.rewards.scoring.judge import Scorer


class RunnerResources(Protocol):
    """What one evaluation uses of its :class:`~memgym.evolution.execution.runner.ProgramRunner`:
    ``rt`` (backends, embedder, per-role call ledger), ``settings``, the stage ``cache``,
    ``model_lock`` (held around every model call), ``context_budget`` (None = no cut), the
    lazily built ``task`` backend and ``scorer``, and ``stage_settings(stage)``, the settings part
    of a stage's cache key (:func:`memgym.evolution.execution.stage_cache.stage_settings`)."""

    rt: Runtime
    settings: RunnerSettings
    cache: StageCache
    model_lock: AbstractContextManager
    context_budget: ContextBudget | None

    @property
    def task(self) -> Backend: ...

    @property
    def scorer(self) -> Scorer: ...

    def stage_settings(self, stage: str) -> dict: ...


class StageContext:
    """Everything ONE evaluation accumulates and the runner's resources (:attr:`runner`); counters
    are updated under :attr:`lock`, so conversations may run concurrently.
    """

    def __init__(self, runner: RunnerResources, source: str, hashes: dict[str, str]):
        self.runner = runner
        self.settings = runner.settings
        self.cache = runner.cache
        self.rt = runner.rt
        self.source = source
        self.stage_hash = stage_component_hashes(hashes)
        self.stage_items = {s: {"run": 0, "reused": 0} for s in STAGES}
        self.stage_llm_calls = {s: 0 for s in STAGES}
        self.plan_failures = self.retrieve_errors = 0
        self.extraction_stats = {"mode": self.settings.extraction_mode, "sessions": 0, "units": 0, "segments": 0,
                                 "format_failures": 0, "failed_manager_outputs": 0, "manager_failures": {}}
        self.lock = threading.Lock()

    @property
    def task(self):
        return self.runner.task

    @property
    def scorer(self):
        return self.runner.scorer

    def _add(self, name: str, n: int) -> None:
        with self.lock:
            setattr(self, name, getattr(self, name) + n)

    def _add_calls(self, stage: str, n: int) -> None:
        with self.lock:
            self.stage_llm_calls[stage] += n

    def _count(self, stage: str, run: int = 0, reused: int = 0) -> None:
        with self.lock:
            self.stage_items[stage]["run"] += run
            self.stage_items[stage]["reused"] += reused

    def _generate(self, stage: str, batch: list[list[dict]], params: GenerationParams, desc: str,
                  schema=None) -> list[Completion]:
        """Task-LLM completions in chunks of the runtime's batch size; counts real calls.
        ``schema`` (a :class:`memgym.llm.structured.JsonSchema`) constrains every completion."""
        out = []
        bs = max(1, self.rt.batch_size)
        for i in tqdm(range(0, len(batch), bs), desc=desc, disable=not self.settings.progress or len(batch) <= bs,
                      unit="batch", leave=False):
            chunk = batch[i: i + bs]
            with self.runner.model_lock:
                comps = (self.task.generate(chunk, params) if schema is None
                         else self.task.generate(chunk, params, schemas=[schema] * len(chunk)))
            self._add_calls(stage, sum(1 for c in comps if not getattr(c, "cached", False)))
            out += comps
        return out
