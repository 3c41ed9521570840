"""Counts over loaded benchmark conversations (what ``memgym data stats`` prints)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from data_synth.capabilities import count_by_capability, is_abstention_id
from data_synth.locomo import load_locomo
from data_synth.longmemeval import load_longmemeval
from data_synth.splits import split_ids
from memory_bank.schema import Conversation

STATS_DATASETS: tuple[str, ...] = ("locomo", "longmemeval")


def _category_key(cat: str):
    return (0, int(cat), "") if cat.isdigit() else (1, 0, cat)


def dataset_stats(convs: Sequence[Conversation], dataset: str) -> dict:
    """Summary counts of ``convs``.

    Returns a JSON-ready dict: ``conversations``, ``sessions``, ``turns``, ``questions``
    (ints); ``by_category`` (native label -> count, numeric labels in numeric order, others
    alphabetical); ``by_capability`` (``{"F","T","P","M","A"}`` -> count, zeros kept); for
    ``longmemeval`` also ``abstention``, the number of ``_abs`` question ids.

    Raises:
        ValueError: ``dataset`` is not one of :data:`STATS_DATASETS`.
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
    return out


def load_dataset(dataset: str, path: Path | str | None = None, split: str | None = None,
                 splits_path: Path | str | None = None) -> list[Conversation]:
    """Load ``dataset`` ("locomo" | "longmemeval") from ``path`` (default file under the data
    root), keeping only the ids of ``split`` when given (LongMemEval splits come from
    ``splits_path``, default ``longmemeval/splits.json``).

    Raises:
        ValueError: unknown dataset or split, or split ids absent from the file;
        DataFileNotFoundError / DataFormatError from the loaders.
    """
    if dataset not in STATS_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(STATS_DATASETS)}")
    ids = split_ids(dataset, split, splits_path) if split is not None else None
    if dataset == "locomo":
        return load_locomo(path, ids=ids)
    return load_longmemeval(path, question_ids=ids)
