"""The ablation experiment: every variant × every seed under one recipe, resumable.

Source: PrisMem Table 4 (ablations), Table 12 (routing baseline), Fig. 3b (performance boundary).
For seeds ``recipe.seed + 0 .. n-1`` (outer) and each variant (inner), one evolution run with the
same recipe, proposer and budget; the variant only sets ``ablation`` (``full`` = ``none``).

Layout of the experiment directory ``OUT`` (the recipe's ``out``)::

    OUT/experiment_recipe.json   the recipe, variants and seeds (``--resume OUT`` reads it)
    OUT/experiment_state.json    per run: status (running | done) and how often it was started
    OUT/<variant>/seed<k>/       one ordinary run directory (``memgym evolve --resume`` works on it)
    OUT/stages.sqlite, responses.sqlite   caches shared by all runs (identical programs on the
                                 same conversations are executed once in the whole experiment)
    OUT/experiment.json, experiment.md, boundary.png

Every run goes through :func:`memgym.evolution.search.api.evolve`; a :class:`RunBook` callback marks it
done when it ends. Resume: done runs are never started again, a killed run resumes, unstarted
runs start. Metrics (:mod:`memgym.evolution.search.experiment_report`) come from the run directories.
"""
from __future__ import annotations

from memgym.llm.errors import ConfigError, OutputPathError

import dataclasses
import time
from pathlib import Path

from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.protocols import Callback
from memgym.evolution.search.rundir import atomic_write_json, read_json

VARIANTS = {"full": "none", "holistic": "holistic", "round_robin": "round_robin", "random_cases": "random_cases",
            "no_integration": "no_integration"}
"""Variant name → the recipe's ``ablation`` value."""


def parse_variants(text: str | list) -> list[str]:
    """``"full,holistic"`` → ``["full", "holistic"]`` (ValueError naming an unknown variant or
    a repeat)."""
    names = [v.strip() for v in (text.split(",") if isinstance(text, str) else text) if v.strip()]
    bad = [v for v in names if v not in VARIANTS]
    if bad or not names:
        raise ConfigError(f"--variants: unknown variant(s) {bad or '(none given)'}; choose from {', '.join(VARIANTS)}")
    if len(set(names)) != len(names):
        raise ConfigError(f"--variants: a variant is listed twice: {names}")
    return names


class Experiment:
    """One experiment in ``cfg.out`` (module doc). ``variants``: names of :data:`VARIANTS`;
    ``seeds``: how many seeds (≥ 1); ``rt``: a shared Runtime (default: built with the
    response cache in OUT)."""

    def __init__(self, cfg: EvolveConfig, variants: list[str], seeds: int, rt=None):
        if seeds < 1:
            raise ConfigError(f"--seeds must be >= 1, got {seeds}")
        self.cfg, self.variants, self.n_seeds = cfg, parse_variants(variants), seeds
        self.root = Path(cfg.out)
        self.seeds = [cfg.seed + i for i in range(seeds)]
        self._rt = rt

    @property
    def rt(self):
        """The runtime every run shares (response cache in OUT unless the recipe names one)."""
        if self._rt is None:
            from memgym.evolution.search.api import build_runtime
            self._rt = build_runtime(self.cfg, self.root)
        return self._rt

    @classmethod
    def from_dir(cls, root: str | Path, rt=None) -> "Experiment":
        """The experiment stored in ``root`` (FileNotFoundError when there is none)."""
        spec = read_json(Path(root) / "experiment_recipe.json")
        if spec is None:
            raise ConfigError(f"no experiment to resume in {root}: experiment_recipe.json is missing")
        cfg = EvolveConfig.from_record(spec["recipe"])
        cfg.out = str(root)
        return cls(cfg, spec["variants"], spec["seeds"], rt=rt)

    def run_dir(self, variant: str, seed: int) -> Path:
        return self.root / variant / f"seed{seed}"

    def run_config(self, variant: str, seed: int) -> EvolveConfig:
        """The recipe of one run: the experiment's, with this variant's ablation and seed, its own
        out dir, and the shared caches."""
        return dataclasses.replace(self.cfg, ablation=VARIANTS[variant], seed=seed,
                                   out=str(self.run_dir(variant, seed)),
                                   stage_cache=self.cfg.stage_cache or str(self.root / "stages.sqlite"),
                                   cache=self.cfg.cache or str(self.root / "responses.sqlite"))

    def _state(self) -> dict:
        return read_json(self.root / "experiment_state.json", {"runs": {}})

    def _save_state(self, st: dict) -> None:
        atomic_write_json(self.root / "experiment_state.json", st)

    def run(self, *, resume: bool = False) -> dict:
        """Run (or continue) every run, then write experiment.json / .md and boundary.png.
        Returns the experiment.json dict. FileExistsError when ``OUT`` holds an experiment and
        ``resume`` is False."""
        from tqdm.auto import tqdm

        from memgym.evolution.search import api
        from memgym.evolution.search.experiment_report import write_experiment

        spec_path = self.root / "experiment_recipe.json"
        if spec_path.exists() and not resume:
            raise OutputPathError(f"{self.root} already holds an experiment; continue it with: memgym evolve "
                                  f"experiment --resume {self.root}")
        self.root.mkdir(parents=True, exist_ok=True)
        if not spec_path.exists():
            atomic_write_json(spec_path, {"recipe": dataclasses.asdict(self.cfg), "variants": self.variants,
                                          "seeds": self.n_seeds})
        st = self._state()
        pairs = [(v, s) for s in self.seeds for v in self.variants]
        bar = tqdm(total=len(pairs), desc="experiment runs", unit="run", disable=not self.cfg.progress)
        t0 = time.time()
        try:
            for variant, seed in pairs:
                name = f"{variant}/seed{seed}"
                row = st["runs"].setdefault(name, {"status": "new", "starts": 0, "wall_s": 0.0})
                if row["status"] == "done" and (self.run_dir(variant, seed) / "summary.json").exists():
                    bar.update(1)
                    continue
                rdir = self.run_dir(variant, seed)
                row["status"], row["starts"] = "running", row["starts"] + 1
                self._save_state(st)
                api.evolve(self.run_config(variant, seed), rt=self.rt, resume=(rdir / "recipe.json").exists(),
                           callbacks=[RunBook(self, st, name, time.time())])
                bar.update(1)
        finally:
            bar.close()
        st["wall_s"] = st.get("wall_s", 0.0) + time.time() - t0
        self._save_state(st)
        return write_experiment(self)


class RunBook(Callback):
    """Records run ``name`` of ``experiment`` as done (with its wall time since ``t0``) in
    ``experiment_state.json`` (``st``) when the run ends, after its reports are written."""

    def __init__(self, experiment: Experiment, st: dict, name: str, t0: float):
        self.experiment, self.st, self.name, self.t0 = experiment, st, name, t0

    def on_run_end(self, state, result) -> None:
        row = self.st["runs"][self.name]
        row["status"], row["wall_s"] = "done", row["wall_s"] + time.time() - self.t0
        self.experiment._save_state(self.st)
