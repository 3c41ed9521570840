"""What ``memgym data check`` verifies: every file memgym reads from ``$MEMGYM_DATA``, loaded by
the commands' loaders, against the counts ``$MEMGYM_DATA/README.md`` states (reported, not fixed)."""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from memgym.llm.errors import MemgymError
from memgym.data_synth.paths import data_root, expert_dir


@dataclass(frozen=True)
class DataCheck:
    """One checked item: ``name`` (e.g. ``"locomo"``), ``path``, ``ok``, and ``detail``: the
    counts when it loads, else the one-line reason."""

    name: str
    path: Path
    ok: bool
    detail: str


#: (name, loader arguments, expected conversations, expected questions) from $MEMGYM_DATA/README.md.
_DATASETS = (
    ("locomo", ("locomo", None), 10, 1986),
    ("longmemeval (oracle)", ("longmemeval", None), 500, 500),
    ("longmemeval (S)", ("longmemeval", "longmemeval/longmemeval_s_subset.json"), 199, 199),
    ("beam", ("beam", None), 26, 520),
)


def _dataset(name: str, dataset: str, rel: str | None, n_conv: int, n_q: int) -> DataCheck:
    from memgym.data_synth.datasets import load_conversations

    path = data_root() / rel if rel else None
    shown = path or {"locomo": data_root() / "locomo" / "locomo10.json",
                     "longmemeval": data_root() / "longmemeval" / "longmemeval_oracle.json",
                     "beam": data_root() / "beam"}[dataset]
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # known quirks (int answers, duplicate ids) are not failures
            convs = load_conversations(dataset, path)
    except (OSError, ValueError, MemgymError) as e:  # missing, unreadable or broken: reported, never raised
        return DataCheck(name, shown, False, str(e).splitlines()[0])
    questions = sum(len(c.questions) for c in convs)
    detail = f"{len(convs)} conversations, {sum(len(c.sessions) for c in convs)} sessions, {questions} questions"
    ok = (len(convs), questions) == (n_conv, n_q)
    return DataCheck(name, shown, ok, detail if ok else f"{detail} (expected {n_conv} and {n_q})")


def _file(name: str, path: Path) -> DataCheck:
    return DataCheck(name, path, path.is_file(), "present" if path.is_file() else "missing")


def _expert(conv: str) -> DataCheck:
    from memgym.data_synth.expert import replay

    path = expert_dir() / f"{conv}.jsonl"
    try:
        bank = replay(path)
    except (OSError, ValueError, MemgymError) as e:  # missing, unreadable or broken: reported, never raised
        return DataCheck(f"expert {conv}", path, False, str(e).splitlines()[0])
    s = bank.summary()
    return DataCheck(f"expert {conv}", path, True, f"{s['sessions']} sessions replay to {s['episodic']} episodic, "
                     f"{s['semantic']} semantic, {s['procedural']} procedural, core {s['core_chars']} chars")


def check_data() -> list[DataCheck]:
    """Checks of every dataset, expert trajectory and LongMemEval split file; a broken file is
        a ``DataCheck`` with ``ok=False`` and the loader's message, never an exception."""
    checks = [_dataset(name, *args, n_conv, n_q) for name, args, n_conv, n_q in _DATASETS]
    checks += [_file("longmemeval splits", data_root() / "longmemeval" / "splits.json"),
               _file("longmemeval S splits", data_root() / "longmemeval" / "s_splits.json")]
    checks += [_expert("conv-26"), _expert("conv-30")]
    return checks
