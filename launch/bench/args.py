"""Parse-time argument types of ``memgym bench``: every value is checked before any work starts
(an out-of-range or unknown value is a usage error naming the flag, exit 2, never a traceback
minutes later)."""
from __future__ import annotations

import argparse
import json
import os
from functools import lru_cache


def int_range(lo: int, hi: int | None = None):
    """An argparse ``type=``: an integer in ``[lo, hi]`` (``hi`` None: no upper bound)."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < lo or (hi is not None and value > hi):
            raise argparse.ArgumentTypeError(f"must be {f'between {lo} and {hi:,}' if hi is not None else f'>= {lo}'}"
                                             f", got {text}")
        return value

    parse.__name__ = "int"
    return parse


@lru_cache(maxsize=1)
def _locomo_ids() -> tuple[str, ...]:
    from data_synth.paths import locomo_path

    path = locomo_path()
    try:
        with open(path, encoding="utf-8") as fh:
            return tuple(str(c.get("sample_id")) for c in json.load(fh) if isinstance(c, dict))
    except (OSError, ValueError) as e:
        raise argparse.ArgumentTypeError(f"cannot read the LoCoMo ids from {path}: {e}") from None


def locomo_conversation(text: str) -> str:
    """An argparse ``type=``: a LoCoMo ``sample_id`` of the shipped file (``conv-26``)."""
    ids = _locomo_ids()
    if text not in ids:
        raise argparse.ArgumentTypeError(f"unknown LoCoMo conversation {text!r}; known: {', '.join(ids)}")
    return text


def expert_conversation(text: str) -> str:
    """An argparse ``type=``: a trajectory file, or a LoCoMo conversation with a shipped expert
    trajectory (``conv-30``)."""
    from data_synth.paths import expert_dir

    if os.path.isfile(text):
        return text
    locomo_conversation(text)
    d = expert_dir()
    have = sorted(f[:-6] for f in os.listdir(d) if f.endswith(".jsonl")) if d.is_dir() else []
    if text not in have:
        raise argparse.ArgumentTypeError(f"conversation {text!r} has no expert trajectory in {d}; with one: "
                                         f"{', '.join(have) or 'none'}")
    return text


def physical_memory_bytes() -> int:
    """This machine's RAM in bytes (0 when the OS does not say)."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 0
