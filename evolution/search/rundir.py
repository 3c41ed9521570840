"""The run directory of ``memgym evolve``: atomic JSON/text writes and the file layout.

Layout (docs/design.md § "Run state")::

    DIR/recipe.json          the recipe as given (``--resume`` reads it)
    DIR/seed.py              the starting program
    DIR/state.json           format, archive (scores left out; integration log), RNG state, ledger,
                             history (one record per round), next round, the recipe (after every round)
    DIR/candidates/<id>/     program.py and one file per journal record
                             (:mod:`memgym.evolution.search.journal`): proposal.json (prompt/response
                             transcript, edits, outcome, RNG state after it), validation.json,
                             eval.json (train/valid scores: their one copy; diagnostics, usage),
                             revise.json, outcome.json (what the round decided)
    DIR/final.json           the test runs of the final step
    DIR/stages.sqlite        stage-output cache;  DIR/responses.sqlite  LLM response cache
    DIR/report.md, capabilities.png, summary.json, best.py

Every file is written to a temporary name in the same folder and renamed over the target
(``os.replace``), so a kill -9 leaves either the old or the new file, never half of one.
Reading is checked: a damaged file raises :class:`RunStateError` whose message names the file
and what is wrong (:func:`read_json`, :func:`check_state`, :func:`check_recipe`). One process
at a time works in a run directory (:func:`run_lock`, ``DIR/.lock``).
"""
from __future__ import annotations

import dataclasses
import fcntl
import json
import os
import tempfile
import threading
from contextlib import contextmanager
from pathlib import Path

from memgym.llm.errors import ConfigError, MemgymError

LOCK_NAME = ".lock"
STATE_FORMAT = 2
"""``state.json``'s format: 2 = scores only in ``eval.json``, typed history and integration log
(a run directory written in format 1 cannot be resumed: :func:`check_state`)."""
# recipe fields that only change the display: a --resume may differ in them
DISPLAY_FIELDS = frozenset({"out", "progress"})


class RunStateError(ConfigError):
    """A run file is unreadable or does not fit the run (the message names the file)."""


class RunLockedError(MemgymError, FileExistsError):
    """Another process holds the run directory's lock (a usage error: exit status 2)."""

    kind = "usage"


def atomic_write_text(path: str | Path, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (parent folders created)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: str | Path, value) -> None:
    """Write ``value`` as indented JSON atomically."""
    atomic_write_text(path, json.dumps(value, indent=1, ensure_ascii=False, default=str))


def read_json(path: str | Path, default=None):
    """The JSON value at ``path``, or ``default`` when the file does not exist. Raises
    :class:`RunStateError` naming the file (and line/column) when it is not UTF-8 JSON."""
    p = Path(path)
    if not p.exists():
        return default
    try:
        return json.loads(p.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise RunStateError(f"{p}: damaged JSON at line {e.lineno} column {e.colno}: {e.msg} (truncated or edited?)") \
            from None
    except UnicodeDecodeError as e:
        raise RunStateError(f"{p}: not UTF-8 text (byte {e.start})") from None
    except OSError as e:
        raise RunStateError(f"{p}: cannot be read: {e.strerror}") from None


_STATE_TYPES = {"archive": dict, "ledger": dict, "history": list, "rng": list, "next_round": int,
                "elapsed_s": (int, float), "recipe": dict}


def check_state(st, path: str | Path) -> dict:
    """``st`` (state.json's value) when its shape is a run state's; else :class:`RunStateError`
    naming ``path`` and the first problem: not an object, another format than :data:`STATE_FORMAT`
    (a run of an older memgym), a missing key, a key of the wrong
    type (null included), an archive whose candidates are not objects with an id or whose base,
    specialists, attempts or history rows name a candidate it does not hold, an RNG state that
    is not [version, list, gauss]."""
    if not isinstance(st, dict):
        raise RunStateError(f"{path}: damaged run state: a JSON object expected, got {type(st).__name__}")
    if st.get("format", 1) != STATE_FORMAT:
        raise RunStateError(f"{path}: a run state of format {st.get('format', 1)!r}; this memgym resumes format "
                            f"{STATE_FORMAT} only (a run of an older memgym): start a new run in another folder")
    for key, typ in _STATE_TYPES.items():
        if key not in st:
            raise RunStateError(f"{path}: damaged run state: key {key!r} is missing")
        if not isinstance(st[key], typ) or isinstance(st[key], bool):
            raise RunStateError(f"{path}: damaged run state: {key!r} is {type(st[key]).__name__}, not "
                                f"{getattr(typ, '__name__', 'a number')}")
    if st["next_round"] < 1:
        raise RunStateError(f"{path}: damaged run state: next_round {st['next_round']} < 1")
    rng = st["rng"]
    if len(rng) != 3 or not isinstance(rng[0], int) or not isinstance(rng[1], list) or len(rng[1]) != 625:
        raise RunStateError(f"{path}: damaged run state: 'rng' is not a random.Random state")
    arch = st["archive"]
    for key, typ in (("candidates", list), ("base", str), ("specialists", dict), ("selections", dict),
                     ("case_usage", dict), ("combo_usage", dict), ("attempts", dict), ("integrations", list)):
        if not isinstance(arch.get(key), typ):
            what = "missing" if key not in arch else f"{type(arch[key]).__name__}, not {typ.__name__}"
            raise RunStateError(f"{path}: damaged run state: archive.{key} is {what}")
    ids = set()
    for i, c in enumerate(arch["candidates"]):
        if not isinstance(c, dict) or not isinstance(c.get("id"), str):
            raise RunStateError(f"{path}: damaged run state: archive.candidates[{i}] is not a candidate with an id")
        ids.add(c["id"])
    named = {arch["base"], *arch["specialists"].values()}
    named |= {i for v in arch["attempts"].values() if isinstance(v, list) for i in v}
    named |= {row.get("candidate") for row in st["history"]  # "-": an integration round that had nothing to merge
              if isinstance(row, dict) and row.get("candidate") not in (None, "", "-")}
    if not all(isinstance(row, dict) for row in st["history"]):
        raise RunStateError(f"{path}: damaged run state: a 'history' row is not an object")
    missing = sorted(named - ids, key=str)
    if missing:
        raise RunStateError(f"{path}: damaged run state: the archive names candidates it does not hold: "
                            f"{', '.join(map(str, missing))}")
    return st


def recipe_fields(cfg, display: bool = False) -> dict:
    """The recipe (a dataclass) in its one JSON form: ``recipe.json`` (``display``: with the
    :data:`DISPLAY_FIELDS`) and, without them, state.json's for :func:`check_recipe`."""
    return {k: v for k, v in json.loads(json.dumps(dataclasses.asdict(cfg), default=str)).items()
            if display or k not in DISPLAY_FIELDS}


def check_recipe(stored: dict, cfg, recipe_path: str | Path, state_path: str | Path) -> None:
    """Refuse a recipe that differs from the one the stored state was made with."""
    now = recipe_fields(cfg)
    diff = [k for k in sorted(set(stored) | set(now)) if stored.get(k) != now.get(k)]
    if diff:
        shown = "; ".join(f"{k}: {stored.get(k)!r} in the run, {now.get(k)!r} in {Path(recipe_path).name}"
                          for k in diff[:4]) + (f" (+{len(diff) - 4} more)" if len(diff) > 4 else "")
        raise RunStateError(f"{recipe_path} does not match the run stored in {state_path} ({shown}); restore the "
                            "recipe or start a new run in another folder")


_held: dict[str, list] = {}
_held_lock = threading.Lock()


@contextmanager
def run_lock(root: str | Path):
    """Hold ``root/.lock`` (``flock``, released by the kernel when the process dies, kill -9
    included) for the block; re-entrant within one process. Raises :class:`RunLockedError`
    naming the holder's pid when another process holds it."""
    root = Path(root)
    key = str(root.resolve())
    with _held_lock:
        if key in _held:
            _held[key][1] += 1
            entry = _held[key]
        else:
            entry = None
    if entry is None:
        root.mkdir(parents=True, exist_ok=True)
        fd = os.open(root / LOCK_NAME, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise RunLockedError(f"another memgym process (pid {holder}) is working in {root}; wait for it to end "
                                 "or stop it first") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        with _held_lock:
            _held[key] = entry = [fd, 1]
    try:
        yield
    finally:
        with _held_lock:
            entry[1] -= 1
            if entry[1] == 0:
                del _held[key]
                os.close(entry[0])  # closing the last fd releases the flock


class RunDir:
    """Paths of one run directory (see the module doc)."""

    def __init__(self, root: str | Path):
        self.root = Path(root)

    def cand(self, cid: str) -> Path:
        return self.root / "candidates" / cid

    @property
    def state(self) -> Path:
        return self.root / "state.json"

    @property
    def recipe(self) -> Path:
        return self.root / "recipe.json"
