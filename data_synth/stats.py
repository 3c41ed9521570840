"""Counts over loaded benchmark conversations (what ``memgym data stats`` prints)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from pathlib import Path

from data_synth.beam import load_beam
from data_synth.capabilities import count_by_capability, is_abstention_id
from data_synth.locomo import load_locomo
from data_synth.longmemeval import load_longmemeval
from data_synth.splits import split_ids
from memory_bank.schema import Conversation

STATS_DATASETS: tuple[str, ...] = ("locomo", "longmemeval", "beam")


def _category_key(cat: str):
    return (0, int(cat), "") if cat.isdigit() else (1, 0, cat)


def dataset_stats(convs: Sequence[Conversation], dataset: str, with_ids: bool = False) -> dict:
    """Summary counts of ``convs``.

    Returns a JSON-ready dict: ``conversations``, ``sessions``, ``turns``, ``questions``
    (ints); ``by_category`` (native label -> count, numeric labels in numeric order, others
    alphabetical); ``by_capability`` (``{"F","T","P","M","A"}`` -> count, zeros kept); for
    ``longmemeval`` also ``abstention``, the number of ``_abs`` question ids; for ``beam``
    also ``rubric_items`` (total) and ``chats`` (chat id -> {sessions, turns, questions}).
    With ``with_ids``, ``ids`` lists every question id in load order (the ids ``memgym score``
    expects in a predictions file).

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
    if dataset == "beam":
        out["rubric_items"] = sum(len(q.rubric) for q in questions)
        out["chats"] = {c.id: {"sessions": len(c.sessions), "turns": c.n_turns(), "questions": len(c.questions)}
                        for c in convs}
    if with_ids:
        out["ids"] = [q.id for q in questions]
    return out


def load_dataset(dataset: str, path: Path | str | None = None, split: str | None = None,
                 splits_path: Path | str | None = None, *, beam_truncated: bool = True,
                 beam_strip_markers: bool = True) -> list[Conversation]:
    """Load ``dataset`` ("locomo" | "longmemeval" | "beam") from ``path`` (default file or
    folder under the data root; for BEAM a chat folder, a size folder or the BEAM root),
    keeping only the ids of ``split`` when given (LongMemEval splits come from
    ``splits_path``, default ``longmemeval/splits.json``). ``beam_truncated`` and
    ``beam_strip_markers`` are :func:`data_synth.beam.load_beam`'s switches.

    Raises:
        ValueError: unknown dataset or split, or split ids absent from the file;
        DataFileNotFoundError / DataFormatError from the loaders.
    """
    if dataset not in STATS_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(STATS_DATASETS)}")
    ids = split_ids(dataset, split, splits_path) if split is not None else None
    if dataset == "locomo":
        return load_locomo(path, ids=ids)
    if dataset == "beam":
        if ids is not None and path is not None:  # a chat or size folder: keep the split's chats found there
            from data_synth.beam import chat_id_of, find_chats
            found = {chat_id_of(f) for f in find_chats(path)}
            ids = [i for i in ids if i in found]
        return load_beam(path, ids=ids, truncated=beam_truncated, strip_markers=beam_strip_markers)
    return load_longmemeval(path, question_ids=ids)
