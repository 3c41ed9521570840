"""The recipe fields that say which benchmark data is scored and under which judge protocol,
declared once and shared by every recipe (``memgym eval``, ``memgym program eval``,
``memgym evolve``) by inheritance, so that no recipe declares or copies them on its own.

- :class:`BenchmarkFields`: ``dataset``, ``path``, the BEAM switches, ``n_sessions``,
  ``max_questions``, ``judge_protocol``.
- :class:`QuestionSelection`: adds ``conversations`` and ``split`` (eval, program eval; evolve
  names its ids per split instead: ``train`` / ``valid`` / ``test``).
- :class:`CapabilityLabels`: ``labels``, the capability labels questions are grouped by.

:func:`load_selected` loads what a recipe selects (:func:`memgym.data_synth.datasets.load_conversations`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memgym.data_synth.datasets import DATASETS, load_conversations
from memgym.llm.checks import Section

__all__ = ["BenchmarkFields", "QuestionSelection", "CapabilityLabels", "load_selected", "ANSWER_TOKENS",
           "answer_tokens_for"]

#: Default answer budget (tokens) per dataset: LoCoMo / LongMemEval answers are short; BEAM asks
#: for lists (event ordering) and summaries, which the judge must see whole.
ANSWER_TOKENS = {"locomo": 48, "longmemeval": 128, "beam": 512}


def answer_tokens_for(dataset: str | None, value: int | None) -> int:
    """``value`` when set, else the dataset's :data:`ANSWER_TOKENS` (48 for an unknown one)."""
    return value if value is not None else ANSWER_TOKENS.get(dataset or "", 48)


@dataclass
class BenchmarkFields(Section):
    """The data section: which benchmark, which part of its histories, and which judge protocol."""

    CHECKS = {"n_sessions": {"min": 1}, "max_questions": {"min": 1}}

    dataset: str = field(default="locomo", metadata={"help": " | ".join(DATASETS), "choices": DATASETS})
    path: str | None = field(default=None, metadata={"help": "data file; None: the dataset's file under $MEMGYM_DATA; "
                                                             "for beam a chat folder, a size folder or the BEAM root"})
    beam_full_chat: bool = field(default=False, metadata={"help": "beam: read chat.json even where "
                                                                  "chat_trunecated.json exists"})
    beam_keep_markers: bool = field(default=False, metadata={"help": "beam: keep the ' ->-> b,k' plan markers"})
    n_sessions: int | None = field(default=None, metadata={"help": "first N sessions only (>= 1); QA kept iff "
                                                                     "all its evidence lies in them"})
    max_questions: int | None = field(default=None, metadata={"help": "cap on QA per conversation (>= 1)"})
    judge_protocol: str = field(default="official", metadata={
        "help": "official (the benchmark's own judge code, byte for byte, its file checked by sha256; the default, "
                "comparable with published numbers) | corrected (beam only: the question filled in and 0.5 kept) | "
                "custom:<file> (another protocol file, e.g. an edited one, named with its sha256 in every report)"})

    def check(self) -> None:
        super().check()
        if self.dataset is not None:
            self.check_protocol()

    def check_protocol(self) -> None:
        """Raises :class:`memgym.llm.errors.ConfigError` for a protocol the dataset does not offer
        (:func:`memgym.rewards.scoring.judge_protocols.check_protocol`)."""
        from memgym.llm.errors import ConfigError
        from memgym.rewards.scoring.judge_protocols import JudgeProtocolError, check_protocol

        try:
            check_protocol(self.dataset, self.judge_protocol)
        except JudgeProtocolError as e:
            raise ConfigError(f"--judge_protocol: {e}") from None


@dataclass
class CapabilityLabels(Section):
    """Which capability labels group the questions (never shown to a program)."""

    labels: str = field(default="native", metadata={"help": "native | annotator label JSONL (train/valid only; "
                                                            "memgym annotate)"})


@dataclass
class QuestionSelection(BenchmarkFields):
    """:class:`BenchmarkFields` plus the conversation / question ids or a split name."""

    COMMAND_DEFAULTS = {"conversations": ["conv-30"]}

    conversations: list[str] | None = field(default=None, metadata={
        "help": "conversation / question ids to run (one id or a list; beam: chat ids, e.g. 100K-3; default: eval "
                "conv-30, program eval conv-26 conv-30)"})
    split: str | None = field(default=None, metadata={"help": "run this split's ids instead of conversations: "
                                                              "train|valid|test (locomo, beam), sft|rl|test "
                                                              "(longmemeval)"})


def load_selected(cfg: QuestionSelection):
    """The conversations a recipe selects (ids, or the ``split``'s), cut to ``n_sessions`` and
    ``max_questions``, relabelled from ``cfg.labels`` when set.
    """
    convs = load_conversations(cfg.dataset, cfg.path, ids=None if cfg.split else cfg.conversations, split=cfg.split,
                               n_sessions=cfg.n_sessions, max_questions=cfg.max_questions,
                               beam_truncated=not cfg.beam_full_chat, beam_strip_markers=not cfg.beam_keep_markers)
    labels = getattr(cfg, "labels", "native")
    if labels != "native":
        from memgym.data_synth.annotate import apply_labels, load_labels
        convs = apply_labels(convs, load_labels(labels))
    return convs
