"""``memgym score``: missing and unknown ids reported, broken input = one error line, and the
scores of a hand-checked predictions file."""
from __future__ import annotations

import json

from data_synth.beam import beam_root
from launch.cli import main

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
    err = capsys.readouterr().err
    assert rc == 0 and "Traceback" not in err
    assert "18 question(s) without a prediction scored 0" in err and "1 prediction id(s) not in the data" in err
    s = json.loads((tmp_path / "out" / "scores.json").read_text())
    assert s["unknown"] == ["conv-26:q1"] and len(s["missing"]) == 18 and s["n"] == 20 and s["n_scored"] == 2
    # rubric "LLM response should state: 6 weeks" is met; chat mean for the ability = (1 + 0) / 2
    assert s["headline"]["by_ability"]["information_extraction"] == 0.5
    assert s["by_category"]["knowledge_update"] == 0.0
    assert s["overall"] == 0.05 and s["by_capability"]["F"] == 0.5
    assert set(s) >= {"overall", "by_category", "by_capability", "headline", "missing", "unknown"}
    md = (tmp_path / "out" / "report.md").read_text()
    assert "Missing predictions (scored 0): 18" in md and "`conv-26:q1`" in md and "mean of the 10 BEAM" in md


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
    from data_synth.longmemeval import load_longmemeval
    from rewards.judge import make_scorer
    from rewards.scoring import score_predictions
    from tests.helpers import ScriptedBackend

    convs = load_longmemeval(question_ids=["001be529", "06878be2"])
    backend = ScriptedBackend(lambda m, p: "yes" if "Paris" in m[1]["content"] else "no")
    preds = {"001be529": {"prediction": "Paris", "context": None}}
    rep = score_predictions("longmemeval", convs, preds, make_scorer("llm", backend, dataset="longmemeval"))
    assert rep["missing"] == ["06878be2"] and len(backend.seen) == 1
    assert rep["headline"]["overall_accuracy"] == 0.5 and rep["judge_calls"]["prompts"] == 1
