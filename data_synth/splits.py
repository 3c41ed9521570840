"""Train/valid/test splits of the benchmarks (``docs/design.md`` § "Data model"); nothing tunes on a
test split. LoCoMo: train conv-26, conv-30; valid conv-41, conv-42; test conv-43, 44, 47-50.
LongMemEval: ``longmemeval/splits.json`` (MemBuilder's ``{sft: 50, rl: 50, test: 400}``). BEAM
(PrisMem protocol, ``beam/README.md``): train 100K chats 3-10, valid 11-16, test every 1M chat.
"""
from __future__ import annotations

from pathlib import Path

from memgym.data_synth.errors import DataFormatError
from memgym.data_synth.paths import longmemeval_splits_path, read_json

LOCOMO_SPLITS: dict[str, tuple[str, ...]] = {
    "train": ("conv-26", "conv-30"),
    "valid": ("conv-41", "conv-42"),
    "test": ("conv-43", "conv-44", "conv-47", "conv-48", "conv-49", "conv-50"),
}
LONGMEMEVAL_SPLIT_NAMES: tuple[str, ...] = ("sft", "rl", "test")
# longmemeval/s_splits.json (LongMemEval-S, the evolution protocol): {train: 52, valid: 47, test: 100}
LONGMEMEVAL_S_SPLIT_NAMES: tuple[str, ...] = ("train", "valid", "test")
BEAM_SPLITS: dict[str, tuple[str, ...]] = {
    "train": tuple(f"100K-{n}" for n in range(3, 11)),
    "valid": tuple(f"100K-{n}" for n in range(11, 17)),
    "test": tuple(f"1M-{n}" for n in (3, 4, 6, 7, 8, 9, 10, 31)),
}
TEST_SPLIT = "test"


def split_names(dataset: str) -> tuple[str, ...]:
    """``("train", "valid", "test")``; longmemeval ``("sft", "rl", "test", "train", "valid")``
        (``splits.json`` / ``s_splits.json``). ValueError for a dataset without splits.
        """
    ds = str(dataset).strip().lower()
    if ds == "locomo":
        return tuple(LOCOMO_SPLITS)
    if ds == "longmemeval":
        return LONGMEMEVAL_SPLIT_NAMES + LONGMEMEVAL_S_SPLIT_NAMES[:2]
    if ds == "beam":
        return tuple(BEAM_SPLITS)
    raise ValueError(f"no splits defined for dataset {dataset!r}; expected locomo, longmemeval or beam")


def _check_split(dataset: str, split: str) -> str:
    names = split_names(dataset)
    if split not in names:
        raise ValueError(f"unknown {dataset} split {split!r}; expected one of {', '.join(names)}")
    return split


def longmemeval_splits(path: Path | str | None = None) -> dict[str, list[str]]:
    """Question ids per split of ``splits.json`` (sft/rl/test) or ``s_splits.json`` (train/valid/
        test). DataFileNotFoundError; DataFormatError (record = split, field = index) for bad
        content or an id in two splits.
        """
    p = Path(path) if path is not None else longmemeval_splits_path()
    data = read_json(p, "LongMemEval splits file")
    if not isinstance(data, dict):
        raise DataFormatError(p, "-", "-", f"expected a JSON object, got {type(data).__name__}")
    names = next((n for n in (LONGMEMEVAL_SPLIT_NAMES, LONGMEMEVAL_S_SPLIT_NAMES) if set(data) == set(n)), None)
    if names is None:
        raise DataFormatError(p, "-", "-", f"expected keys {', '.join(LONGMEMEVAL_SPLIT_NAMES)} (splits.json) or "
                                           f"{', '.join(LONGMEMEVAL_S_SPLIT_NAMES)} (s_splits.json),"
                                           f" got {', '.join(sorted(map(str, data)))}")
    owner: dict[str, str] = {}
    out: dict[str, list[str]] = {}
    for name in names:
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
    """Conversation ids (LoCoMo, BEAM) or question ids (LongMemEval; ``path`` default from
        :mod:`memgym.data_synth.paths`) of ``split``. ValueError for an unknown dataset or split.
        """
    _check_split(dataset, split)
    if str(dataset).strip().lower() == "locomo":
        return list(LOCOMO_SPLITS[split])
    if str(dataset).strip().lower() == "beam":
        return list(BEAM_SPLITS[split])
    splits = longmemeval_splits(path)
    if split not in splits:
        where = path if path is not None else longmemeval_splits_path()
        raise ValueError(f"LongMemEval split {split!r} is not in {where} (it has {', '.join(splits)}); "
                         "sft/rl are in splits.json, train/valid in s_splits.json (--splits-path)")
    return splits[split]


def is_test_split(dataset: str, split: str) -> bool:
    """True iff ``split`` is ``dataset``'s held-out test split; ValueError for unknown names."""
    return _check_split(dataset, split) == TEST_SPLIT
