"""Counts over loaded benchmark conversations (what ``memgym data stats`` prints)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from data_synth.capabilities import count_by_capability, is_abstention_id
from data_synth.datasets import DATASETS
from memory_bank.schema import Conversation

STATS_DATASETS: tuple[str, ...] = DATASETS


def _category_key(cat: str):
    return (0, int(cat), "") if cat.isdigit() else (1, 0, cat)


def dataset_stats(convs: Sequence[Conversation], dataset: str, with_ids: bool = False) -> dict:
    """JSON-ready counts of ``convs``: ``conversations``, ``sessions``, ``turns``, ``questions``,
        ``by_category`` (numeric labels first), ``by_capability``; longmemeval ``abstention``; beam
        ``rubric_items`` and ``chats``; ``with_ids``: every question id in load order.
        ValueError for a dataset outside :data:`STATS_DATASETS`.
        """
    if dataset not in STATS_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(STATS_DATASETS)}")
    questions = [q for c in convs for q in c.questions]
    cats = Counter(q.category for q in questions)
    out = {
        "conversations": len(convs),
        "sessions": sum(len(c.sessions) for c in convs),
        "turns": sum(c.n_turns() for c in convs),
        "questions": len(questions),
        "by_category": {k: cats[k] for k in sorted(cats, key=_category_key)},
        "by_capability": count_by_capability(questions),
    }
    if dataset == "longmemeval":
        out["abstention"] = sum(1 for q in questions if is_abstention_id(q.id))
    if dataset == "beam":
        out["rubric_items"] = sum(len(q.rubric) for q in questions)
        out["chats"] = {c.id: {"sessions": len(c.sessions), "turns": c.n_turns(), "questions": len(c.questions)}
                        for c in convs}
    if with_ids:
        out["ids"] = [q.id for q in questions]
    return out
