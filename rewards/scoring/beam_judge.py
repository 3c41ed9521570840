"""BEAM's ability names and the offline rubric-recall proxy (the official judge is
:class:`memgym.rewards.scoring.official.BeamScorer`).
"""
from __future__ import annotations

import re
from collections.abc import Sequence

from memgym.rewards.scoring.metrics import answer_tokens

__all__ = ["BEAM_ABILITY_ORDER", "EVENT_ORDERING", "rubric_item_tokens", "rubric_recall"]

BEAM_ABILITY_ORDER: tuple[str, ...] = (
    "abstention", "contradiction_resolution", "event_ordering", "information_extraction", "instruction_following",
    "knowledge_update", "multi_session_reasoning", "preference_following", "summarization", "temporal_reasoning")
EVENT_ORDERING = "event_ordering"


_BOILERPLATE = re.compile(r"^\s*(?:the\s+)?(?:llm\s+)?response\s+should\s+(?:\w+\s*){0,3}?:\s*", re.IGNORECASE)
#: Function words ignored by :func:`rubric_recall` (after LoCoMo normalisation and stemming).
_STOP = frozenset(answer_tokens(
    "i me my we our you your he she it its they them their this that these those is are was were be been being "
    "have has had do does did of in on at to for from by with about as or not no but if then so than into over "
    "under after before between during up down out any all each some such can could should would will shall may "
    "might must what which who whom when where why how there here very just also only own same other more most"))


def rubric_item_tokens(item: str) -> set[str]:
    """Content tokens of a rubric item: the ``LLM response should state/mention/contain:``
    prefix dropped, LoCoMo-normalised, Porter-stemmed, function words removed."""
    return {t for t in answer_tokens(_BOILERPLATE.sub("", item)) if t not in _STOP}


def rubric_recall(rubric: Sequence[str], text: str) -> float:
    """Offline BEAM proxy in [0, 1]: the share of rubric items all of whose content tokens
    (:func:`rubric_item_tokens`) occur in ``text``'s tokens. Items without content tokens are
    skipped; 0.0 when no item has any."""
    items = [s for s in (rubric_item_tokens(x) for x in rubric) if s]
    if not items:
        return 0.0
    have = set(answer_tokens(text))
    return sum(1 for s in items if s <= have) / len(items)
