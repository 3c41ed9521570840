"""``memgym score``: missing and unknown ids reported, broken input = one error line, and the
scores of a hand-checked predictions file."""
from __future__ import annotations

import json

import pytest

from memgym.data_synth.beam import beam_root
from memgym.launch.cli import main

CHAT = str(beam_root() / "100K" / "3")


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def test_score_missing_and_unknown(tmp_path, capsys):
    preds = _write(tmp_path / "p.jsonl", [
        {"question_id": "100K-3:information_extraction:1", "prediction": "It took about 6 weeks."},
        {"question_id": "100K-3:knowledge_update:1", "prediction": "No idea."},
        {"question_id": "conv-26:q1", "prediction": "x"}])
    rc = main(["score", "--dataset", "beam", "--path", CHAT, "--predictions", str(preds), "--judge", "rubric-recall",
               "--out", str(tmp_path / "out")])
    out, err = capsys.readouterr()
    assert rc == 3 and "Traceback" not in err  # a partial file is scored but does not pass as complete
    assert "incomplete: the predictions cover 2 of 20 questions" in err and '"coverage": "partial: 2 of 20 questions"' in out
    assert "18 question(s) without a prediction left out of the scores" in err
    assert "1 prediction id(s) not in the data" in err
    s = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert s["unknown"] == ["conv-26:q1"] and len(s["missing"]) == 18 and s["n"] == 20 and s["judged"] == 2
    # rubric "LLM response should state: 6 weeks" is met; the missing questions are not counted (issue 16)
    assert s["by_ability"] == {"information_extraction": 1.0, "knowledge_update": 0.0}
    assert s["by_category"]["knowledge_update"] == {"score": 0.0, "n": 1}
    assert s["overall"] == 0.5 and s["by_capability"]["F"] == {"score": 1.0, "n": 1}
    assert set(s) >= {"judge_protocol", "overall", "by_ability", "by_category", "by_capability", "judged", "missing",
                      "unknown"} and s["judge_protocol"] == "official"
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Missing predictions: 18" in md and "`conv-26:q1`" in md and "mean of the BEAM abilities" in md
    assert "an offline proxy of memgym's (no judge call), not the benchmark's own number" in md
    assert md.count("**partial: 2 of 20 questions**") == 1 and "cut to 2048 tokens of smollm2" in md
    rc = main(["score", "--dataset", "beam", "--path", CHAT, "--predictions", str(preds), "--judge", "rubric-recall",
               "--missing_as_wrong", "--out", str(tmp_path / "out2")])
    s = json.loads((tmp_path / "out2" / "scores.json").read_text())
    assert rc == 0 and s["missing_as_wrong"] and s["coverage"] == "partial: 2 of 20 questions" and s["overall"] == 0.05  # (1 + 0) / 2 and 0 over the 10 abilities


def test_score_broken_predictions_one_line(tmp_path, capsys):
    preds = tmp_path / "p.jsonl"
    preds.write_text('{"question_id": "100K-3:abstention:1", "prediction": "none"}\n{"question_id": "x"}\n')
    rc = main(["score", "--dataset", "beam", "--path", CHAT, "--predictions", str(preds), "--judge", "f1"])
    err = capsys.readouterr().err
    assert rc == 2 and "Traceback" not in err
    assert "line 2, field prediction: missing" in err
    rc = main(["score", "--dataset", "locomo", "--predictions", str(preds), "--judge", "rubric-recall"])
    assert rc == 2 and "BEAM rubrics only" in capsys.readouterr().err


def test_score_longmemeval_official_judge(tmp_path):
    from memgym.data_synth.longmemeval import load_longmemeval
    from memgym.rewards.scoring.scorers import make_scorer
    from memgym.rewards.scoring.predictions import score_predictions
    from tests.helpers import ScriptedBackend

    convs = load_longmemeval(question_ids=["001be529", "06878be2"])
    backend = ScriptedBackend(lambda m, p: "yes" if "Paris" in m[0]["content"] else "no")
    preds = {"001be529": {"prediction": "Paris", "context": None, "line": 1}}
    rep = score_predictions("longmemeval", convs, preds, make_scorer("llm", backend, dataset="longmemeval"))
    assert rep["missing"] == ["06878be2"] and len(backend.seen) == 1 and len(backend.seen[0][0]) == 1
    # over the judged questions (the official rule): 1 of 1, not 1 of 2
    assert rep["overall"] == 1.0 and rep["task_averaged"] == 1.0 and rep["judged"] == 1
    assert rep["judge_calls"]["prompts"] == 1 and rep["rows"][0]["judge"][0]["reply"] == "yes"


# ------------------------------------------------------------------ issue 16: other systems' formats


def test_score_takes_longmemeval_hypothesis_format(tmp_path, capsys):
    from tests.fake_judge import FakeJudge, user_text

    preds = _write(tmp_path / "h.jsonl", [{"question_id": "001be529", "hypothesis": "over a year"},
                                          {"question_id": "0862e8bf_abs", "hypothesis": "I do not know."}])
    with FakeJudge(lambda b: "yes" if "over a year" in user_text(b) else "no") as fj:
        rc = main(["score", "--dataset", "longmemeval", "--split", "test", "--predictions", str(preds),
                   "--judge", fj.spec, "--cache", "none", "--out", str(tmp_path / "out"), "--allow_partial"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert (s["judged"], len(s["missing"]), s["overall"], s["abstention"]) == (2, 398, 0.5, 0.0)
    assert s["task_averaged"] == 0.5 and s["judge_protocol"] == "official" and len(fj.bodies) == 2
    bad = _write(tmp_path / "b.jsonl", [{"question_id": "001be529", "hypothesis": "a", "prediction": "b"}])
    assert main(["score", "--dataset", "longmemeval", "--split", "test", "--predictions", str(bad), "--judge",
                 "f1"]) == 2
    assert "line 1, field prediction: both" in capsys.readouterr().err


# ------------------------------------------------------------------ issue 19, finding 8: bad input


def _locomo_preds(tmp_path):
    return _write(tmp_path / "p.jsonl", [{"question_id": f"conv-26/q{i}", "prediction": "7 May 2023"}
                                         for i in range(3)])


def _score_locomo(tmp_path, judge_spec, out="out", cache=None, preds=None):
    return main(["score", "--dataset", "locomo", "--predictions", str(preds or _locomo_preds(tmp_path)),
                 "--judge", judge_spec, "--cache", str(cache or tmp_path / "r.sqlite"), "--out", str(tmp_path / out),
                 "--allow_partial"])


def _garbage_run(tmp_path):
    from tests.fake_judge import FakeJudge

    with FakeJudge(lambda b: "<html>502 Bad Gateway</html>") as fj:
        return _score_locomo(tmp_path, fj.spec)


def test_score_garbage_judge_warns(tmp_path, capsys):
    rc = _garbage_run(tmp_path)
    err = capsys.readouterr().err
    assert rc == 0 and "3 of 3 judge replies were unreadable" in err and "502 Bad Gateway" in err


def test_score_report_says_the_judge_never_retries(tmp_path, capsys):
    assert _garbage_run(tmp_path) == 0
    md = (tmp_path / "out" / "report.md").read_text()
    assert "3 requests, no retries" in md and "None prompts" not in md and "0 retried" not in md


def test_score_never_caches_unreadable_replies(tmp_path, capsys):
    from tests.fake_judge import FakeJudge

    with FakeJudge(lambda b: "garbage") as fj:
        assert _score_locomo(tmp_path, fj.spec) == 0
        fj.reply = lambda b: '{"label": "CORRECT"}'  # the server is fixed; same URL and model: same cache keys
        assert _score_locomo(tmp_path, fj.spec, out="out2") == 0
        assert len(fj.bodies) == 6  # asked again, not replayed from the cache
        assert _score_locomo(tmp_path, fj.spec, out="out3") == 0
        assert len(fj.bodies) == 6  # readable replies are cached
    s = json.loads((tmp_path / "out2" / "scores.json").read_text())
    assert s["overall"] == 1.0


def test_score_empty_out_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    preds = _locomo_preds(tmp_path)
    assert main(["score", "--dataset", "locomo", "--predictions", str(preds), "--judge", "f1", "--out", ""]) == 2
    assert "--out: give an output folder" in capsys.readouterr().err and not (tmp_path / "scores.json").exists()


def test_score_out_naming_a_file_is_one_line(tmp_path, capsys):
    preds = _locomo_preds(tmp_path)
    afile = tmp_path / "afile"
    afile.write_text("x")
    for out in (str(afile), str(afile / "sub")):
        assert main(["score", "--dataset", "locomo", "--predictions", str(preds), "--judge", "f1", "--out", out]) == 2
        err = capsys.readouterr().err
        assert "Traceback" not in err and "--out" in err and str(afile) in err and "Errno" not in err


def test_score_refuses_a_folder_of_user_files(tmp_path, capsys):
    from memgym.llm.checks import out_dir_problem

    preds = _locomo_preds(tmp_path)
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "report.md").write_text("my notes")
    (mine / "data.csv").write_text("1,2")
    args = ["score", "--dataset", "locomo", "--predictions", str(preds), "--judge", "f1", "--allow_partial", "--out"]
    assert main([*args, str(mine)]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"memgym score: error: {mine} holds files but no memgym score output (data.csv, report.md); memgym score "
        "writes scores.json, rows.jsonl, report.md there: choose a new or empty folder"]
    assert sorted(p.name for p in mine.iterdir()) == ["data.csv", "report.md"]
    assert (mine / "report.md").read_text() == "my notes"
    # a folder of its own earlier scores is rewritten; the filesystem root, run as root, never is
    assert main([*args, str(tmp_path / "o")]) == 0 and main([*args, str(tmp_path / "o")]) == 0
    assert "holds files but no memgym score output" in out_dir_problem("/", what="memgym score output",
                                                                         own=("scores.json",), mark="scores.json",
                                                                         writes="-")


def test_score_non_utf8_names_file_and_line(tmp_path, capsys):
    latin = tmp_path / "latin.jsonl"
    latin.write_bytes(b'{"question_id": "conv-26/q0", "prediction": "ok"}\n{"question_id": "conv-26/q1", '
                      b'"prediction": "caf\xe9"}\n')
    assert main(["score", "--dataset", "locomo", "--predictions", str(latin), "--judge", "f1",
                 "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert f"file {latin}, line 2" in err and "not UTF-8" in err and "0xe9" in err


def test_score_all_unknown_ids_exits_nonzero(tmp_path, capsys):
    unknown = _write(tmp_path / "u.jsonl", [{"question_id": "conv-99/q0", "prediction": "x"}])
    assert main(["score", "--dataset", "locomo", "--predictions", str(unknown), "--judge", "f1",
                 "--out", str(tmp_path / "o2")]) == 2
    assert "none of the 1 prediction ids" in capsys.readouterr().err and not (tmp_path / "o2").exists()


# ------------------------------------------------------------------ what a predictions file covers


def test_score_one_question_of_a_split_is_not_a_clean_headline(tmp_path, capsys):
    """A file covering 1 of the 453 valid questions, with the gold evidence as its context, scores
    1.0 on that question but is reported partial, with exit 3 unless --allow_partial."""
    from memgym.data_synth.datasets import load_conversations

    conv = load_conversations("locomo", ids=["conv-41"])[0]
    q = conv.questions[0]
    index = conv.turn_index
    ctx = "\n".join(f"{index[e][1].speaker}: {index[e][1].text} [image: {index[e][1].image_caption}]"
                    for e in q.evidence)  # D13:16, an image turn: its caption is part of the turn
    preds = _write(tmp_path / "one.jsonl", [{"question_id": q.id, "prediction": "-", "context": ctx}])
    argv = ["score", "--dataset", "locomo", "--split", "valid", "--predictions", str(preds), "--judge",
            "grounded-recall", "--out", str(tmp_path / "out")]
    assert main(argv) == 3
    out, err = capsys.readouterr()
    s = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert (s["n"], s["judged"], s["overall"], s["coverage"]) == (453, 1, 1.0, "partial: 1 of 453 questions")
    assert "incomplete: the predictions cover 1 of 453 questions" in err
    assert "**partial: 1 of 453 questions**" in (tmp_path / "out" / "report.md").read_text()
    assert main(argv[:-1] + [str(tmp_path / "out2"), "--allow_partial"]) == 0
    assert main(argv[:-1] + [str(tmp_path / "out3"), "--missing_as_wrong"]) == 0
    assert json.loads((tmp_path / "out3" / "scores.json").read_text())["overall"] == pytest.approx(1 / 453)


def test_score_empty_file_is_an_error(tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n\n")
    assert main(["score", "--dataset", "locomo", "--predictions", str(empty), "--judge", "f1",
                 "--out", str(tmp_path / "out")]) == 2
    assert "no predictions (the file holds no JSON line)" in capsys.readouterr().err
    assert not (tmp_path / "out" / "scores.json").exists()


def test_score_cuts_contexts_to_the_evaluation_budget(tmp_path):
    """answer-recall over others' contexts reads only the first --context_tokens tokens, as an
    evaluation does: an answer after the cut earns nothing."""
    pad = "filler words here " * 400  # ~1,600 SmolLM2 tokens
    preds = _write(tmp_path / "p.jsonl", [{"question_id": "conv-26/q0", "prediction": "-",
                                           "context": pad + " 7 May 2023"}])
    base = ["score", "--dataset", "locomo", "--predictions", str(preds), "--judge", "answer-recall", "--allow_partial"]
    assert main(base + ["--out", str(tmp_path / "cut")]) == 0
    assert main(base + ["--out", str(tmp_path / "wide"), "--context_tokens", "4000"]) == 0
    cut = json.loads((tmp_path / "cut" / "scores.json").read_text())
    wide = json.loads((tmp_path / "wide" / "scores.json").read_text())
    assert cut["context_budget"] == "1024 tokens of smollm2" and cut["overall"] == 0.0
    assert wide["overall"] == 1.0
