"""Corrupt sqlite caches are found at open, with the file and the recovery named; a file that
breaks mid-run is dropped with a warning and the run goes on (issue 12, finding 7)."""
from __future__ import annotations

import sqlite3

import numpy as np
import pytest

from memgym.evolution.execution.stage_cache import StageCache
from memgym.launch.cli import main as memgym
from memgym.llm.base import Completion
from memgym.llm.cache import CacheCorruptError, ResponseCache
from memgym.llm.embeddings import EmbeddingCache


def _garbage(path):
    path.write_bytes(b"this is not a sqlite database at all" * 200)
    return path


@pytest.mark.parametrize("open_", [ResponseCache, EmbeddingCache, StageCache])
def test_corrupt_cache_is_named_at_open(open_, tmp_path):
    path = _garbage(tmp_path / "c.sqlite")
    with pytest.raises(CacheCorruptError) as e:
        open_(path)
    msg = str(e.value)
    assert str(path) in msg and "is corrupt" in msg and f"mv '{path}' '{path}.corrupt'" in msg


def test_corrupt_response_cache_is_one_line_before_any_model_loads(tmp_path, capsys):
    path = _garbage(tmp_path / "responses.sqlite")
    rc = memgym(["eval", "--cache", str(path), "--conversations", "conv-30", "--out", str(tmp_path / "o")])
    err = capsys.readouterr().err
    assert rc == 1 and len(err.strip().splitlines()) == 1
    assert f"the response cache {path} is corrupt" in err and "--cache none" in err


def test_cache_broken_mid_run_warns_and_goes_on(tmp_path):
    cache = ResponseCache(tmp_path / "r.sqlite")
    cache.put_many([("k1", "m", Completion("hello"))])
    cache._conn.close()

    def broken(*a, **k):
        raise sqlite3.DatabaseError("database disk image is malformed")

    class Conn:  # a connection whose every statement fails like a file broken mid-run
        execute = executemany = staticmethod(broken)

        def close(self):
            pass

    cache._conn = Conn()
    with pytest.warns(UserWarning, match="is corrupt .* continuing without it"):
        assert cache.get_many(["k1"]) == {}
    cache.put_many([("k2", "m", Completion("x"))])  # no error: the run goes on uncached
    emb = EmbeddingCache(tmp_path / "e.sqlite")
    emb._conn = Conn()
    with pytest.warns(UserWarning, match="embedding cache"):
        emb.put_many({"a": np.ones(3)})
    assert emb.get_many(["a"], 3)["a"].tolist() == [1.0, 1.0, 1.0]  # the in-memory part still serves


def test_empty_completions_are_never_cached(tmp_path):
    cache = ResponseCache(tmp_path / "r.sqlite")
    cache.put_many([("a", "m", Completion("")), ("b", "m", Completion("  \n")), ("c", "m", Completion("ok"))])
    assert set(cache.get_many(["a", "b", "c"])) == {"c"} and len(cache) == 1
