"""Train/valid/test splits of the benchmarks. Nothing tunes on a test split.

Source: ``DESIGN.md`` § "Data model" (Splits). LoCoMo: train conv-26, conv-30 (expert
trajectories exist for both); valid conv-41, conv-42; test conv-43, conv-44, conv-47, conv-48,
conv-49, conv-50. LongMemEval: ``longmemeval/splits.json``, the MemBuilder paper's question-id
split ``{sft: 50, rl: 50, test: 400}``. BEAM (``beam/README.md``, the PrisMem protocol: evolve
on 100K, test on 1M): train = 100K chats 3-10, valid = 100K chats 11-16, test = every 1M chat
(3, 4, 6, 7, 8, 9, 10, 31); 100K chats 17-20 are spare (in no split).
"""
from __future__ import annotations

from pathlib import Path

from data_synth.errors import DataFormatError
from data_synth.paths import longmemeval_splits_path, read_json

LOCOMO_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("conv-26", "conv-30"),
    "valid": ("conv-41", "conv-42"),
    "test": ("conv-43", "conv-44", "conv-47", "conv-48", "conv-49", "conv-50"),
}
LONGMEMEVAL_SPLIT_NAMES: tuple[str, ...] = ("sft", "rl", "test")
BEAM_SPLITS: dict[str, tuple[str, ...]] = {
    "train": tuple(f"100K-{n}" for n in range(3, 11)),
    "valid": tuple(f"100K-{n}" for n in range(11, 17)),
    "test": tuple(f"1M-{n}" for n in (3, 4, 6, 7, 8, 9, 10, 31)),
}
TEST_SPLIT = "test"


def split_names(dataset: str) -> tuple[str, ...]:
    """``("train", "valid", "test")`` for locomo and beam, ``("sft", "rl", "test")`` for longmemeval.

    Raises:
        ValueError: a dataset without splits (the message names the known ones).
    """
    ds = str(dataset).strip().lower()
    if ds == "locomo":
        return tuple(LOCOMO_SPLITS)
    if ds == "longmemeval":
        return LONGMEMEVAL_SPLIT_NAMES
    if ds == "beam":
        return tuple(BEAM_SPLITS)
    raise ValueError(f"no splits defined for dataset {dataset!r}; expected locomo, longmemeval or beam")


def _check_split(dataset: str, split: str) -> str:
    names = split_names(dataset)
    if split not in names:
        raise ValueError(f"unknown {dataset} split {split!r}; expected one of {', '.join(names)}")
    return split


def longmemeval_splits(path: Path | str | None = None) -> dict[str, list[str]]:
    """Read ``splits.json``: ``{"sft": [...], "rl": [...], "test": [...]}`` question ids.

    Raises:
        DataFileNotFoundError: the file is absent.
        DataFormatError: bad JSON, not an object with exactly the keys sft/rl/test, a value
            that is not a list of strings, or an id listed in two splits (``record`` is the
            split name, ``field`` the index).
    """
    p = Path(path) if path is not None else longmemeval_splits_path()
    data = read_json(p, "LongMemEval splits file")
    if not isinstance(data, dict):
        raise DataFormatError(p, "-", "-", f"expected a JSON object, got {type(data).__name__}")
    if set(data) != set(LONGMEMEVAL_SPLIT_NAMES):
        raise DataFormatError(p, "-", "-", f"expected keys {', '.join(LONGMEMEVAL_SPLIT_NAMES)},"
                                           f" got {', '.join(sorted(map(str, data)))}")
    owner: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for name in LONGMEMEVAL_SPLIT_NAMES:
        ids = data[name]
        if not isinstance(ids, list):
            raise DataFormatError(p, name, "-", f"expected a list, got {type(ids).__name__}")
        for k, q in enumerate(ids):
            if not isinstance(q, str):
                raise DataFormatError(p, name, f"[{k}]", f"expected str, got {type(q).__name__}")
            if q in owner:
                raise DataFormatError(p, name, f"[{k}]", f"id {q!r} also in split {owner[q]!r}")
            owner[q] = name
        out[name] = list(ids)
    return out


def split_ids(dataset: str, split: str, path: Path | str | None = None) -> list[str]:
    """Conversation ids (LoCoMo ``sample_id``, BEAM chat id ``"100K-3"``) or question ids
    (LongMemEval) of a split.

    Args:
        dataset: ``"locomo"``, ``"longmemeval"`` or ``"beam"``.
        split: one of :func:`split_names` for that dataset.
        path: LongMemEval ``splits.json`` (default from :mod:`data_synth.paths`); ignored for
            LoCoMo and BEAM, whose splits are fixed by DESIGN.md / ``beam/README.md``.

    Raises:
        ValueError: unknown dataset or split; plus the errors of :func:`longmemeval_splits`.
    """
    _check_split(dataset, split)
    if str(dataset).strip().lower() == "locomo":
        return list(LOCOMO_SPLITS[split])
    if str(dataset).strip().lower() == "beam":
        return list(BEAM_SPLITS[split])
    return longmemeval_splits(path)[split]


def is_test_split(dataset: str, split: str) -> bool:
    """True iff ``split`` is the held-out test split of ``dataset`` (only "test" is).

    Raises:
        ValueError: unknown dataset or split name.
    """
    return _check_split(dataset, split) == TEST_SPLIT
