"""Rollout samples of the dense session reward, one per (conversation, session t or one of its
segments, manager m): the prompt is built from the expert's bank before the session (or segment)
and the QA of session t scores the completion (docs/design.md § "Dense session reward and ADRPO").
They are built from expert trajectories by :mod:`memgym.training.reward_rows`.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from memgym.memory_bank.bank import MemoryBank
from memgym.memory_bank.schema import QAItem

__all__ = ["RewardSample", "sample_key"]


def sample_key(conversation_id: str, session: int, manager: str, segment: int = 0) -> str:
    """``"<conversation_id>/s<session>/<manager>"``, or ``"<conversation_id>/s<session>.<segment>/<manager>"``
    for segment ``segment`` >= 1."""
    return f"{conversation_id}/s{session}{f'.{segment}' if segment else ''}/{manager}"


@dataclass
class RewardSample:
    """One rollout prompt of ADRPO and what its reward needs.

    key: :func:`sample_key`; session: t, 1-based; messages: the manager prompt; expert_outputs:
    the expert's output JSON for all four managers; bank_before: the expert bank before the
    session or segment (shared, never mutate); qa: the questions it is scored on; segment: 0 for
    a whole session, k >= 1 for the k-th segment. :attr:`unit` keys the reward's caches.
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
