"""Rollout samples of the dense session reward, one per (conversation, session t, manager m):
the prompt is built from the expert's bank after session t-1 and the QA of session t scores
the completion (docs/design.md § "Dense session reward and ADRPO").
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from memgym.data_synth.datasets import conversations_by_id
from memgym.data_synth.expert import TrajectoryError, banks_before_sessions, load_trajectories
from memgym.data_synth.qa_format import load_session_qa, qa_item_from_json
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.prompts import build_prompt
from memgym.memory_bank.schema import QAItem

__all__ = ["RewardSample", "build_reward_samples", "sample_key"]


def sample_key(conversation_id: str, session: int, manager: str) -> str:
    """``"<conversation_id>/s<session>/<manager>"``."""
    return f"{conversation_id}/s{session}/{manager}"


@dataclass
class RewardSample:
    """One rollout prompt of ADRPO and what its reward needs.

    key: ``f"{conversation_id}/s{session}/{manager}"``; session: t, 1-based; messages: the
    manager prompt; expert_outputs: the expert's output JSON for all four managers; bank_before:
    the expert bank after t-1 (shared, never mutate); qa: session t's questions; segment: 0 for a
    whole session, k >= 1 for the k-th segment. :attr:`unit` keys the reward's caches.
    """

    key: str
    conversation_id: str
    session: int
    manager: str
    messages: list[dict]
    expert_outputs: dict[str, str]
    bank_before: MemoryBank
    qa: list[QAItem] = field(default_factory=list)
    segment: int = 0

    @property
    def unit(self) -> tuple[str, int, int]:
        """``(conversation_id, session, segment)``: what one set of expert outputs belongs to."""
        return (self.conversation_id, self.session, self.segment)


def build_reward_samples(trajectory_paths, *, dataset: str = "locomo", data_path=None, qa_path=None,
                         embedder=None, managers: Sequence[str] = MANAGERS) -> list[RewardSample]:
    """One :class:`RewardSample` per (trajectory line, manager), in file order.

    QA comes from each line's ``qa`` or from ``qa_path``; sessions without QA are skipped (one
    warning). ``embedder`` ranks the entries each prompt shows (None: most recent). Raises
    TrajectoryError, ValueError (unknown manager, a ``qa_path`` matching no session),
    FileNotFoundError.
    """
    paths = [trajectory_paths] if isinstance(trajectory_paths, (str, Path)) else list(trajectory_paths)
    for m in managers:
        if m not in MANAGERS:
            raise ValueError(f"unknown manager {m!r}; expected some of {MANAGERS}")
    qa_file = load_session_qa(qa_path) if qa_path is not None else None
    samples: list[RewardSample] = []
    skipped = []
    for path in paths:
        steps = load_trajectories(path)
        try:
            before = banks_before_sessions(steps)
        except TrajectoryError as e:  # banks_before_sessions does not know the file name
            raise TrajectoryError(path, e.line, e.field, e.reason) from None
        convs = conversations_by_id(dataset, [s.conversation_id for s in steps], data_path)
        for step in steps:
            conv = convs[step.conversation_id]
            session = next((s for s in conv.sessions if s.index == step.session), None)
            if session is None:
                raise TrajectoryError(path, step.line, "session",
                                      f"{step.conversation_id} has no session {step.session} in {dataset}")
            if qa_file is not None:
                qa = qa_file.get((step.conversation_id, step.session), [])
            else:
                qa = [qa_item_from_json(q, step.conversation_id, step.session, j, step.date, path, step.line)
                      for j, q in enumerate(step.qa)]
            if not qa:
                skipped.append(f"{step.conversation_id}/s{step.session}")
                continue
            bank = before[(step.conversation_id, step.session)]
            outputs = {m: step.output_text(m) for m in MANAGERS}
            for m in managers:
                samples.append(RewardSample(
                    key=sample_key(step.conversation_id, step.session, m), conversation_id=step.conversation_id,
                    session=step.session, manager=m, messages=build_prompt(m, bank, session, embedder).messages,
                    expert_outputs=outputs, bank_before=bank, qa=list(qa)))
    if qa_file is not None and not samples and skipped:
        raise ValueError(f"QA file {qa_path}: no QA for any of the {len(skipped)} trajectory session(s) "
                         f"(read {len(qa_file)} session(s) from it; e.g. {', '.join(skipped[:3])} are missing): "
                         "is it a `memgym synth qa` output for these conversations?")
    if skipped:
        warnings.warn(f"build_reward_samples: {len(skipped)} session(s) without QA skipped "
                      f"(e.g. {', '.join(skipped[:3])})", stacklevel=2)
    return samples
