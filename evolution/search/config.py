"""``memgym evolve`` recipe: :class:`EvolveConfig`, parsed by ``trl.TrlParser`` (YAML + CLI
overrides). The field names in the issue's Contract (dataset, path, train, valid, test,
extractor, plan_mode, scorer, task_model, proposer, coder_model, rounds_cold, rounds_refine,
rounds_integrate, seed, workers, out) are stable: scripts and later issues rely on them.

Splits (DESIGN.md § "Capability-driven evolution"): LoCoMo train conv-26, conv-30; valid
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

from data_synth.splits import LOCOMO_SPLITS
from rewards.scoring.selection import BenchmarkFields, context_tokenizer_field

ABLATIONS = ("none", "holistic", "round_robin", "random_cases", "no_integration")
"""DESIGN.md § "Capability-driven evolution" (ablations; PrisMem Table 4), see
:mod:`evolution.search.strategies`."""
ROLE_BUDGETS = ("coder", "extract", "plan", "answer", "extractor", "judge")


@dataclass
class EvolveConfig(BenchmarkFields):
    """A ``memgym evolve`` recipe. Every field can be overridden on the command line. The data
    and judge-protocol fields (dataset, path, BEAM switches, n_sessions, max_questions,
    judge_protocol) are :class:`rewards.scoring.selection.BenchmarkFields`, shared with every recipe."""

    CHECKS = {"n_sessions": {"min": 1}, "max_questions": {"min": 1}, "cases": {"min": 1}, "case_budget": {"min": 200},
              "workers": {"min": 1}, "batch_size": {"min": 1}, "plan_max_new_tokens": {"min": 1},
              "answer_max_new_tokens": {"min": 1}, "extract_max_new_tokens": {"min": 1},
              "coder_max_new_tokens": {"min": 1}, "call_timeout_s": {"min": 0.001},
              "validate_timeout_s": {"min": 0.001}, "probe_units": {"min": 1}, "probe_batches": {"min": 1},
              "context_tokens": {"min": 1}, "rounds_cold": {"min": 0}, "rounds_refine": {"min": 0}, "rounds_integrate": {"min": 0},
              "extractor": {"spec": "extractor", "words": ("instruction", "turns")}, "task_model": {"spec": "backend"},
              "judge_model": {"spec": "backend"}, "coder_model": {"spec": "backend"}, "out": {"out_dir": True},
              "request_timeout_s": {"min": 0.001}, "request_retries": {"min": 0},
              "dataset": {"choices": ("locomo", "longmemeval", "beam")}, "proposer": {"choices": ("params", "coder", "replay", "scripted")},
              "scorer": {"choices": ("answer-recall", "rubric-recall", "f1", "llm")}, "plan_mode": {"choices": ("llm", "question")},
              "ablation": {"choices": ABLATIONS}, "integrate_onto": {"choices": ("best", "base")},
              "integrate_condition": {"choices": ("none", "specialist", "dropped")}, "delta": {"min": 0.0}, "extractor_max_new_tokens": {"min": 1}}

    test_path: str | None = field(default=None, metadata={"help": "data file of the test split (default: path), "
                                                                  "e.g. a LongMemEval-M file"})
    train: list[str] = field(default_factory=list, metadata={"help": "train conversation / question ids (empty = the "
                                                                     "dataset's default split)"})
    valid: list[str] = field(default_factory=list, metadata={"help": "valid ids (empty = default split)"})
    test: list[str] = field(default_factory=list, metadata={"help": "test ids ([default] = the dataset's test split; "
                                                                   "empty = no test run)"})
    labels: str = field(default="native", metadata={"help": "native | annotator label JSONL (train/valid only)"})
    seed_program: str | None = field(default=None, metadata={"help": "starting program (default: the shipped seed)"})
    extractor: str = field(default="turns", metadata={
        "help": "instruction | turns | expert:<file or conv-NN>[,...] | hf:<dir> | openai:<url>#<model>"})
    task_model: str = field(default="hf:smollm2", metadata={"help": "task LLM spec (plan, answer, extraction)"})
    plan_mode: str = field(default="question", metadata={"help": "llm | question (no LLM: the question is the query)"})
    scorer: str = field(default="answer-recall", metadata={"help": "answer-recall | rubric-recall (beam) | f1 | llm "
                                                                   "(the dataset's official judge)"})
    judge_model: str | None = field(default=None, metadata={"help": "judge spec for scorer llm"})
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
        "help": "none | holistic | round_robin | random_cases | no_integration (DESIGN.md ablations)"})
    test_specialists: bool = field(default=True, metadata={
        "help": "also run every specialist once on the test split (report rows, oracle-label router baseline)"})
    baselines: list[str] = field(default_factory=list, metadata={
        "help": "static baseline programs run once on valid and test beside the frozen one (names of "
                "memory_bank.programs.BASELINES: full_history, bm25, dense_topk, hybrid_rrf, reference)"})
    stage_cache: str | None = field(default=None, metadata={
        "help": "stage-output cache file (default <out>/stages.sqlite; an experiment shares one)"})
    context_tokens: int | None = field(default=None, metadata={
        "help": "context budget: every retrieved text is cut to this many tokens (of context_tokenizer) before it is "
                "answered and scored, the same for every program, so returning more text is no gain (None = "
                "none; the program's own 16,000-character limit still holds)"})
    context_tokenizer: str = context_tokenizer_field()
    cases: int = field(default=5, metadata={"help": "compact cases per proposal"})
    case_budget: int = field(default=2400, metadata={"help": "characters per displayed excerpt"})
    seed: int = field(default=0, metadata={"help": "RNG seed of the run"})
    workers: int = field(default=1, metadata={"help": "conversations evaluated concurrently (one sandbox each)"})
    batch_size: int = field(default=8, metadata={"help": "LLM generation batch"})
    plan_max_new_tokens: int = field(default=96, metadata={"help": "tokens per plan"})
    answer_max_new_tokens: int | None = field(default=None, metadata={
        "help": "tokens per answer (default by dataset: locomo 48, longmemeval 128, beam 512)"})
    extract_max_new_tokens: int = field(default=1024, metadata={"help": "tokens per instruction extraction"})
    extractor_max_new_tokens: int = field(default=512, metadata={"help": "tokens per trained-extractor output"})
    call_timeout_s: float = field(default=60.0, metadata={"help": "sandbox seconds per index/retrieve call"})
    validate_timeout_s: float = field(default=20.0, metadata={"help": "validation: sandbox seconds per call"})
    probe_units: int = field(default=2000, metadata={"help": "validation level 4: units in the complexity probe"})
    probe_batches: int = field(default=100, metadata={"help": "validation level 4: index batches"})
    budget_coder: int | None = field(default=None, metadata={"help": "token budget of the coder role"})
    budget_extract: int | None = field(default=None, metadata={"help": "token budget of task-LLM extraction"})
    budget_plan: int | None = field(default=None, metadata={"help": "token budget of task-LLM planning"})
    budget_answer: int | None = field(default=None, metadata={"help": "token budget of task-LLM answers"})
    budget_extractor: int | None = field(default=None, metadata={"help": "token budget of a trained extractor"})
    budget_judge: int | None = field(default=None, metadata={"help": "token budget of the judge"})
    request_timeout_s: float | None = field(default=None, metadata={
        "help": "seconds per request to an openai: server (default $MEMGYM_REQUEST_TIMEOUT_S or 60)"})
    request_retries: int | None = field(default=None, metadata={
        "help": "retries of a failed openai: request (default $MEMGYM_REQUEST_RETRIES or 5)"})
    embedder: str = field(default="minilm", metadata={"help": "minilm (all-MiniLM-L6-v2, the default) | hash:<dim> "
                                                                "(model-free bag of words: tests and stub runs only)"})
    cache: str | None = field(default=None, metadata={"help": "response cache (default <out>/responses.sqlite; "
                                                              "'none' disables)"})
    out: str = field(default="runs/evolve", metadata={"help": "run directory"})
    progress: bool = field(default=True, metadata={"help": "progress bars"})

    def __post_init__(self):
        from llm.recipes import check_fields

        check_fields(self)
        if self.dataset not in ("locomo", "longmemeval", "beam"):
            raise ValueError(f"dataset must be locomo, longmemeval or beam, got {self.dataset!r}")
        if self.scorer == "rubric-recall" and self.dataset != "beam":
            raise ValueError("scorer rubric-recall needs dataset beam (it scores BEAM rubrics)")
        if self.proposer not in ("params", "coder", "replay", "scripted"):
            raise ValueError(f"proposer must be params, coder, replay or scripted, got {self.proposer!r}")
        if self.proposer == "replay" and not self.replay_from:
            raise ValueError("proposer replay needs replay_from (memgym evolve --proposer replay --from RUN)")
        if self.proposer == "coder" and not self.coder_model:
            raise ValueError("proposer coder needs coder_model (a backend spec)")
        if self.proposer == "scripted" and not self.script:
            raise ValueError("proposer scripted needs script (a JSON file)")
        if self.scorer == "llm" and not self.judge_model:
            raise ValueError("scorer llm needs judge_model")
        self.check_protocol()
        if not 0.0 <= self.delta <= 1.0:
            raise ValueError(f"delta must be in [0, 1], got {self.delta}")
        for name in ("rounds_cold", "rounds_refine", "rounds_integrate"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")
        if self.embedder != "minilm" and not (self.embedder.startswith("hash:") and
                                              self.embedder[5:].isdigit()):
            raise ValueError(f"embedder must be minilm or hash:<dim>, got {self.embedder!r}")
        if self.cases < 1 or self.case_budget < 200:
            raise ValueError(f"cases must be >= 1 and case_budget >= 200, got {self.cases}, {self.case_budget}")
        if isinstance(self.baselines, str):
            self.baselines = [x.strip() for x in self.baselines.split(",") if x.strip()]
        from memory_bank.programs import BASELINES
        unknown = [b for b in self.baselines if b not in BASELINES]
        if unknown:
            raise ValueError(f"--baselines: unknown baseline program(s) {', '.join(unknown)}; known: "
                             f"{', '.join(BASELINES)}")
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
            raise ValueError(f"splits overlap: {sorted(overlap)}")
        self.runner_settings()

    def default_splits(self) -> dict:
        """The dataset's DESIGN splits."""
        if self.dataset == "locomo":
            return {k: list(v) for k, v in LOCOMO_SPLITS.items()}
        if self.dataset == "beam":
            from data_synth.splits import BEAM_SPLITS
            return {k: list(v) for k, v in BEAM_SPLITS.items()}
        from data_synth.paths import data_root
        return json.loads((data_root() / "longmemeval" / "s_splits.json").read_text())

    @property
    def total_rounds(self) -> int:
        return self.rounds_cold + self.rounds_refine + self.rounds_integrate

    def budgets(self) -> dict:
        """role → token budget (None = unlimited)."""
        return {r: getattr(self, f"budget_{r}") for r in ROLE_BUDGETS}

    def runner_settings(self, diagnostics: bool = True):
        """The :class:`~evolution.execution.runner.RunnerSettings` of this recipe, built by
        :func:`evolution.execution.program_eval.runner_settings_from` (the one place every
        recipe's settings are built: ``dataset`` and ``judge_protocol`` reach the scorer)."""
        from evolution.execution.program_eval import runner_settings_from

        return runner_settings_from(self, diagnostics=diagnostics)

    def data_path(self, split: str = "train") -> str | None:
        """The data file of ``split`` (LongMemEval defaults to the S subset; the test split
        reads ``test_path`` when set; BEAM ``None`` = the BEAM root)."""
        if split == "test" and self.test_path:
            return self.test_path
        if self.path or self.dataset in ("locomo", "beam"):
            return self.path
        from data_synth.paths import data_root
        return str(data_root() / "longmemeval" / "longmemeval_s_subset.json")
