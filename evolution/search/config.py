"""``memgym evolve`` recipe: :class:`EvolveConfig`, parsed by :class:`memgym.llm.recipe.RecipeParser`
(YAML + CLI overrides; a run's stored recipe is read back by :meth:`EvolveConfig.from_record`).
The field names in the issue's Contract (dataset, path, train, valid, test, extractor, plan_mode,
scorer, task_model, proposer, coder_model, rounds_cold, rounds_refine, rounds_integrate, seed,
workers, out) are stable: scripts and later issues rely on them.

Splits (docs/design.md § "Capability-driven evolution"): LoCoMo train conv-26, conv-30; valid
conv-41, conv-42; test the other six. LongMemEval: the S subset with ``s_splits.json`` (train
52, valid 47, test 100 question ids). BEAM (PrisMem's protocol, ``beam/README.md``): train the
100K chats 3-10 (160 questions), valid the 100K chats 11-16 (120), test the eight 1M chats
(160). Empty ``train``/``valid`` take these defaults; ``test: [default]`` takes the default
test split; an empty ``test`` means no test run. ``test_path`` reads the test split from
another file (LongMemEval-M records: evolve on S, test on M).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field

from memgym.data_synth.splits import LOCOMO_SPLITS
from memgym.evolution.execution.settings import OutputSection, RunnerSettings
from memgym.llm.checks import Section
from memgym.llm.errors import ConfigError
from memgym.rewards.scoring.selection import CapabilityLabels
from memgym.llm.embeddings import EMBEDDER_HELP, check_embedder_spec

ABLATIONS = ("none", "holistic", "round_robin", "random_cases", "no_integration")
"""docs/design.md § "Capability-driven evolution" (ablations; PrisMem Table 4), see
:mod:`memgym.evolution.search.strategies`."""
ROLE_BUDGETS = ("coder", "extract", "plan", "answer", "extractor", "judge")
PROPOSERS = ("params", "coder", "replay", "scripted")


class Budgets(dict):
    """Token budgets by role (:data:`ROLE_BUDGETS`): ``{role: tokens}``; a role not named is
    unlimited. From YAML a mapping (``budgets: {coder: 2000000}``); on the command line
    ``--budgets coder=2000000,judge=50000`` or a JSON object. The roles and values are checked
    by :meth:`SearchSettings.check`."""

    def __init__(self, value=None):
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("{"):
                value = json.loads(text)
            else:
                try:
                    value = {k.strip(): int(v) for k, v in (p.split("=", 1) for p in text.split(",") if p.strip())}
                except ValueError:
                    raise ConfigError(f"--budgets {value!r}: expected role=tokens[,role=tokens...] (roles: "
                                      f"{', '.join(ROLE_BUDGETS)})") from None
        super().__init__(value or {})


@dataclass
class SplitSelection(Section):
    """The data of an evolution run: ids per split (``dataset`` and the rest of the data section
    come from :class:`memgym.rewards.scoring.selection.BenchmarkFields`)."""

    test_path: str | None = field(default=None, metadata={"help": "data file of the test split (default: path), "
                                                                  "e.g. a LongMemEval-M file"})
    train: list[str] = field(default_factory=list, metadata={"help": "train conversation / question ids (empty = the "
                                                                     "dataset's default split)"})
    valid: list[str] = field(default_factory=list, metadata={"help": "valid ids (empty = default split)"})
    test: list[str] = field(default_factory=list, metadata={"help": "test ids ([default] = the dataset's test split; "
                                                                   "empty = no test run)"})


@dataclass
class SearchSettings(Section):
    """The search section: the proposer, the three phases, integration, the ablation, the
    validation limits, the run's seed and token budgets by role."""

    CHECKS = {"cases": {"min": 1}, "case_budget": {"min": 200}, "coder_max_new_tokens": {"min": 1},
              "validate_timeout_s": {"min": 0.001}, "probe_units": {"min": 1}, "probe_batches": {"min": 1},
              "rounds_cold": {"min": 0}, "rounds_refine": {"min": 0}, "rounds_integrate": {"min": 0},
              "coder_model": {"spec": "backend"}, "proposer": {"choices": PROPOSERS},
              "ablation": {"choices": ABLATIONS}, "integrate_onto": {"choices": ("best", "base")},
              "integrate_condition": {"choices": ("none", "specialist", "dropped")}, "delta": {"min": 0.0}}
    RENAMED = {f"budget_{r}": "budgets" for r in ROLE_BUDGETS}
    """Old field names -> the field that replaced them (named by the unknown-field message)."""

    seed_program: str | None = field(default=None, metadata={"help": "starting program (default: the shipped seed)"})
    proposer: str = field(default="params", metadata={"help": "params | coder | replay (answers from replay_from's "
                                                                 "recorded coder run, no server) | scripted"})
    replay_from: str | None = field(default=None, metadata={"help": "proposer replay: the recorded run directory "
                                                                    "(memgym evolve --from RUN)"})
    coder_model: str | None = field(default=None, metadata={"help": "coder backend spec (proposer coder), e.g. "
                                                                    "openai:http://host:8000/v1#Qwen3-Coder"})
    coder_max_new_tokens: int = field(default=4096, metadata={"help": "tokens per coder answer"})
    coder_temperature: float = field(default=0.7, metadata={"help": "coder sampling temperature"})
    script: str | None = field(default=None, metadata={"help": "proposer scripted: JSON file {\"proposals\": [...]}"})
    rounds_cold: int = field(default=5, metadata={"help": "cold-start rounds"})
    rounds_refine: int = field(default=15, metadata={"help": "capability-refinement rounds"})
    rounds_integrate: int = field(default=3, metadata={"help": "trace-guided integration rounds (at most; 0 = none)"})
    delta: float = field(default=0.02, metadata={"help": "integration: largest allowed drop of any capability's valid "
                                                         "score against the base"})
    integrate_offline_first: bool = field(default=True, metadata={
        "help": "an LLM proposer's first integration attempt is the offline component merge"})
    integrate_onto: str = field(default="best", metadata={
        "help": "integration merges the specialists onto, and judges the merge against: best (the best valid overall "
                "among the base and the specialists) | base (PrisMem's base)"})
    integrate_condition: str = field(default="none", metadata={
        "help": "after a failed offline merge, first retry its condition-level form (both behaviours in one program, "
                "picked per question by a reader of the question fit on train): none | specialist (the merge's "
                "behaviour for questions read as its contributors' capabilities that did not drop) | dropped (the "
                "base's behaviour for questions read as the capabilities that dropped beyond delta)"})
    ablation: str = field(default="none", metadata={
        "help": "none | holistic | round_robin | random_cases | no_integration (docs/design.md § 'Ablations')"})
    test_specialists: bool = field(default=True, metadata={
        "help": "also run every specialist once on the test split (report rows, oracle-label router baseline)"})
    baselines: list[str] = field(default_factory=list, metadata={
        "help": "static baseline programs run once on valid and test beside the frozen one (names of "
                "memgym.memory_bank.programs.BASELINES: full_history, bm25, dense_topk, hybrid_rrf, reference)"})
    cases: int = field(default=5, metadata={"help": "compact cases per proposal"})
    case_budget: int = field(default=2400, metadata={"help": "characters per displayed excerpt"})
    seed: int = field(default=0, metadata={"help": "RNG seed of the run"})
    validate_timeout_s: float = field(default=20.0, metadata={"help": "validation: sandbox seconds per call"})
    probe_units: int = field(default=2000, metadata={"help": "validation level 4: units in the complexity probe"})
    probe_batches: int = field(default=100, metadata={"help": "validation level 4: index batches"})
    budgets: Budgets = field(default_factory=Budgets, metadata={
        "help": f"token budgets by role, a mapping ({', '.join(ROLE_BUDGETS)}: tokens; a role not named is "
                "unlimited); on the command line role=tokens[,role=tokens...]"})
    embedder: str = field(default="minilm", metadata={"help": EMBEDDER_HELP})

    def check(self) -> None:
        super().check()
        if self.proposer == "replay" and not self.replay_from:
            raise ConfigError("--proposer replay needs --replay_from (memgym evolve --proposer replay --from RUN)")
        if self.proposer == "coder" and not self.coder_model:
            raise ConfigError("--proposer coder needs --coder_model (a backend spec)")
        if self.proposer == "scripted" and not self.script:
            raise ConfigError("--proposer scripted needs --script (a JSON file)")
        if not 0.0 <= self.delta <= 1.0:
            raise ConfigError(f"--delta must be in [0, 1], got {self.delta}")
        try:
            check_embedder_spec(self.embedder, allow_none=False)
        except ValueError as e:
            raise ConfigError(f"--embedder: {e}") from None
        if isinstance(self.baselines, str):
            self.baselines = [x.strip() for x in self.baselines.split(",") if x.strip()]
        from memgym.memory_bank.programs import BASELINES
        unknown = list(dict.fromkeys(b for b in self.baselines if b not in BASELINES))
        if unknown:
            raise ConfigError(f"--baselines: unknown baseline program(s) {', '.join(unknown)}; known: "
                              f"{', '.join(BASELINES)}")
        if not isinstance(self.budgets, Budgets):
            self.budgets = Budgets(self.budgets)
        for role, tokens in self.budgets.items():
            if role not in ROLE_BUDGETS:
                raise ConfigError(f"--budgets: unknown role {role!r}; roles: {', '.join(ROLE_BUDGETS)}")
            if tokens is not None and (isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 1):
                raise ConfigError(f"--budgets: {role} must be a token count >= 1, got {tokens!r}")

    @property
    def total_rounds(self) -> int:
        return self.rounds_cold + self.rounds_refine + self.rounds_integrate

    def role_budgets(self) -> dict:
        """role → token budget for every role of :data:`ROLE_BUDGETS` (None = unlimited)."""
        return {r: self.budgets.get(r) for r in ROLE_BUDGETS}


@dataclass
class EvolveConfig(SplitSelection, CapabilityLabels, RunnerSettings, SearchSettings, OutputSection):
    """A ``memgym evolve`` recipe: the data section (:class:`memgym.rewards.scoring.selection.BenchmarkFields`
    plus the split ids), labels, the models and runner sections (:class:`RunnerSettings`: the
    recipe is the runner's settings), the search section and the run directory (``out``). Every field can be overridden on
    the command line."""

    COMMAND_DEFAULTS = {"extractor": "turns", "plan_mode": "question", "out": "runs/evolve"}

    def check(self) -> None:
        super().check()
        if self.dataset not in ("locomo", "longmemeval", "beam"):
            raise ConfigError(f"--dataset must be locomo, longmemeval or beam, got {self.dataset!r}")
        for k in ("train", "valid", "test"):
            v = getattr(self, k)
            if isinstance(v, str):  # "a,b" or a YAML scalar
                setattr(self, k, [x.strip() for x in v.split(",") if x.strip()])
            else:  # --test '' (no test run) gives [""]; --test a,b gives ["a,b"]
                setattr(self, k, [y.strip() for x in v for y in str(x).split(",") if y.strip()])
        if not self.train or not self.valid or self.test == ["default"]:
            d = self.default_splits()
            self.train = self.train or d["train"]
            self.valid = self.valid or d["valid"]
            if self.test == ["default"]:
                self.test = d["test"]
        overlap = (set(self.train) & set(self.valid)) | (set(self.train) & set(self.test)) | \
                  (set(self.valid) & set(self.test))
        if overlap:
            raise ConfigError(f"splits overlap: {sorted(overlap)}")

    def default_splits(self) -> dict:
        """The dataset's DESIGN splits."""
        if self.dataset == "locomo":
            return {k: list(v) for k, v in LOCOMO_SPLITS.items()}
        if self.dataset == "beam":
            from memgym.data_synth.splits import BEAM_SPLITS
            return {k: list(v) for k, v in BEAM_SPLITS.items()}
        from memgym.data_synth.paths import data_root
        return json.loads((data_root() / "longmemeval" / "s_splits.json").read_text())

    def data_path(self, split: str = "train") -> str | None:
        """The data file of ``split`` (LongMemEval defaults to the S subset; the test split
        reads ``test_path`` when set; BEAM ``None`` = the BEAM root)."""
        if split == "test" and self.test_path:
            return self.test_path
        if self.path or self.dataset in ("locomo", "beam"):
            return self.path
        from memgym.data_synth.paths import data_root
        return str(data_root() / "longmemeval" / "longmemeval_s_subset.json")

    def load_split(self, split: str) -> list:
        """The conversations of ``split`` (its ids, first ``n_sessions``, ``max_questions``,
        BEAM options) with their native labels; [] when the split has no ids."""
        from memgym.data_synth.datasets import load_conversations

        ids = getattr(self, split)
        if not ids:
            return []
        return load_conversations(self.dataset, self.data_path(split), ids=list(ids), n_sessions=self.n_sessions,
                                  max_questions=self.max_questions, beam_truncated=not self.beam_full_chat,
                                  beam_strip_markers=not self.beam_keep_markers)

    @classmethod
    def from_record(cls, d: dict) -> "EvolveConfig":
        """The recipe stored in a run directory (``recipe.json``, :func:`dataclasses.asdict`);
        old field names (:attr:`SearchSettings.RENAMED`: ``budget_<role>``) are read into
        ``budgets``; keys of no field are ignored. Raises what the sections raise."""
        import dataclasses

        known = {f.name for f in dataclasses.fields(cls)}
        kw = {k: v for k, v in d.items() if k in known}
        old = {k[len("budget_"):]: v for k, v in d.items() if k in cls.RENAMED and v is not None}
        if old:
            kw["budgets"] = {**old, **(kw.get("budgets") or {})}
        return cls(**kw)
