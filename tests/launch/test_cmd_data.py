"""``memgym data stats`` through ``memgym.launch.cli.main``."""
from __future__ import annotations

import json

import pytest

from memgym.data_synth.paths import data_root
from memgym.launch.cli import main


def test_stats_locomo(capsys):
    assert main(["data", "stats", "--dataset", "locomo"]) == 0
    out, err = capsys.readouterr()
    s = json.loads(out)
    assert {k: s[k] for k in ("conversations", "sessions", "turns", "questions")} == {
        "conversations": 10, "sessions": 272, "turns": 5882, "questions": 1986}
    assert s["by_category"] == {"1": 282, "2": 321, "3": 96, "4": 841, "5": 446}
    assert s["by_capability"] == {"F": 841, "T": 321, "P": 96, "M": 282, "A": 446}
    assert "abstention" not in s
    assert len([ln for ln in err.splitlines() if ln.startswith("warning: locomo10.json")]) == 6


def test_stats_locomo_split_with_explicit_path(capsys):
    from memgym.data_synth.paths import locomo_path

    assert main(["data", "stats", "--dataset", "locomo", "--path", str(locomo_path()),
                 "--split", "train"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["split"], s["conversations"], s["sessions"]) == ("train", 2, 38)


def test_stats_longmemeval(capsys):
    assert main(["data", "stats", "--dataset", "longmemeval"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert (s["conversations"], s["sessions"], s["turns"], s["questions"]) == (500, 948, 10960,
                                                                              500)
    assert s["abstention"] == 30
    assert s["by_capability"] == {"F": 120, "T": 199, "P": 30, "M": 121, "A": 30}
    assert s["by_category"]["knowledge-update"] == 78


def test_stats_longmemeval_test_split(capsys):
    assert main(["data", "stats", "--dataset", "longmemeval", "--split", "test"]) == 0
    s = json.loads(capsys.readouterr().out)
    assert s["questions"] == 400 and s["conversations"] == 400


@pytest.mark.parametrize("argv, needle", [
    (["--dataset", "locomo", "--path", "/no/such/locomo10.json"],
     "LoCoMo file not found: expected at /no/such/locomo10.json"),
    (["--dataset", "longmemeval", "--split", "valid"], "LongMemEval split 'valid' is not in"),
])
def test_stats_errors_exit_2_one_line(capsys, argv, needle):
    assert main(["data", "stats", *argv]) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("memgym data stats: error: ") and needle in err


def test_stats_broken_file_exit_2(tmp_path, capsys):
    p = tmp_path / "x.json"
    p.write_text("{not json", encoding="utf-8")
    assert main(["data", "stats", "--dataset", "longmemeval", "--path", str(p)]) == 2
    err = capsys.readouterr().err
    assert f"file {p}, record -, field -: invalid JSON at line 1" in err


def test_help(capsys):
    with pytest.raises(SystemExit) as ei:
        main(["data", "stats", "--help"])
    assert ei.value.code == 0
    out = capsys.readouterr().out
    assert "--dataset {locomo,longmemeval,beam}" in out and "--split" in out and "--ids" in out


def test_data_stats_on_the_s_subset_with_its_splits(capsys):
    lme = data_root() / "longmemeval"
    assert main(["data", "stats", "--dataset", "longmemeval", "--path", str(lme / "longmemeval_s_subset.json"),
                 "--splits-path", str(lme / "s_splits.json"), "--split", "valid"]) == 0
    assert json.loads(capsys.readouterr().out)["questions"] == 47


def test_check_loads_every_shipped_item_with_its_counts(capsys):
    assert main(["data", "check"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("data root: ")
    by_name = {ln[5:31].strip(): ln[31:].strip() for ln in lines[1:]}
    assert all(ln.startswith("ok ") for ln in lines[1:]) and len(by_name) == 11
    assert by_name["locomo"] == "10 conversations, 272 sessions, 1986 questions"
    assert by_name["longmemeval (S)"] == "199 conversations, 9452 sessions, 199 questions"
    assert by_name["beam"] == "26 conversations, 156 sessions, 520 questions"
    assert by_name["expert conv-26"].startswith("19 sessions replay to 90 episodic, 63 semantic, 3 procedural")


def test_check_names_what_is_missing(tmp_path, monkeypatch, capsys):
    (tmp_path / "expert").mkdir()
    (tmp_path / "expert" / "conv-26.jsonl").write_text("{not json\n")
    monkeypatch.setenv("MEMGYM_DATA", str(tmp_path))
    assert main(["data", "check"]) == 1
    out, err = capsys.readouterr()
    bad = [ln for ln in out.splitlines() if ln.startswith("BAD")]
    assert len(bad) == 11 and "conv-26.jsonl" in out and str(tmp_path) in out
    assert err.startswith("memgym data check: 11 of 11 items missing or wrong: locomo, ")
