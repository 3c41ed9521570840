"""Cost as the field reports it: tokens per role per round and per run, per test question, and
what the annotator labels of train and valid cost (hand-computed values)."""
from __future__ import annotations

import json

from memgym.data_synth.annotate import AnnotatedLabel
from memgym.evolution.search.ledger import Ledger, cost_section, label_usage, per_question, tokens_by_round
from memgym.memory_bank.schema import Capability
from tests.helpers import conversation


def test_tokens_by_round_sums_the_task_stages_and_orders_the_rounds():
    led = Ledger()
    led.add("final", "answer", 10, 1000, 50)
    led.add(2, "coder", 1, 700, 300)
    led.add(10, "plan", 4, 40, 8)
    led.add(2, "extract", 2, 200, 100)
    led.add(2, "judge", 2, 60, 2)
    led.add(0, "annotator", 3, 90, 12)
    led.add(2, "embed", 5)
    t = tokens_by_round(led)
    assert list(t["rounds"]) == ["0", "2", "10", "final"]
    assert t["rounds"]["2"] == {"coder": 1000, "task": 300, "extractor": 0, "judge": 62, "annotator": 0, "total": 1362}
    assert t["run"] == {"coder": 1000, "task": 300 + 48 + 1050, "extractor": 0, "judge": 62, "annotator": 102,
                        "total": 1000 + 1398 + 62 + 102}
    pq = per_question({"extract": {"prompt": 900, "completion": 100}, "answer": {"prompt": 300, "completion": 20},
                       "judge": {"prompt": 40, "completion": 4}}, 8)
    assert pq["task"] == 1320 / 8 and pq["judge"] == 44 / 8 and pq["total"] == 1364 / 8
    assert per_question({"answer": {"prompt": 1}}, 0) == {}
    summary = {"tokens_by_round": t, "test_tokens_per_question": pq, "test_questions": 8,
               "budgets": {"coder": 900}, "stopped": "budget of role 'coder' exhausted: 1000 >= 900"}
    text = "\n".join(cost_section(summary))
    assert "| 2 | 1,000 | 300 | 0 | 62 | 0 | 1,362 |" in text
    assert "| per test question (frozen program, 8 questions) | 0.0 | 165.0 | 0.0 | 5.5 | 0.0 | 170.5 |" in text
    assert "budgets: coder 900 tokens; **the run ended early: budget of role 'coder' exhausted" in text


def test_estimated_task_calls_are_marked_on_the_stages_and_negative_usage_is_refused():
    from types import SimpleNamespace

    import pytest

    from memgym.evolution.search.ledger import usage_from_eval

    ev = SimpleNamespace(model_calls={"task": 5, "judge": 2}, stage_llm_calls={"plan": 2, "answer": 3},
                         tokens={"task": {"prompt": 500, "completion": 50, "estimated": 3},
                                 "judge": {"prompt": 40, "completion": 2, "estimated": 2}})
    usage = usage_from_eval(ev)
    assert usage == {"plan": {"calls": 2, "prompt": 200, "completion": 20, "estimated": 2},
                     "answer": {"calls": 3, "prompt": 300, "completion": 30, "estimated": 1},
                     "judge": {"calls": 2, "prompt": 40, "completion": 2, "estimated": 2}}
    led = Ledger()
    led.add_usage(1, usage)
    led.add(1, "coder", 1, 700, 300)
    assert led.estimated() == {"plan": 2, "answer": 1, "judge": 2} and "estimated" not in led.rounds["1"]["coder"]
    with pytest.raises(ValueError, match="negative usage for role 'coder'"):
        led.add(2, "coder", 1, -1_000_000_000, 5000)
    assert "2" not in led.rounds


def test_label_usage_books_the_labels_of_the_runs_train_and_valid_questions(tmp_path):
    conv = conversation()
    q1, q2 = conv.questions[0].id, conv.questions[1].id
    rows = [AnnotatedLabel(q1, Capability.TEMPORAL, (), "annotator", False, 1, "m", None, 150, 4),
            AnnotatedLabel(q2, Capability.FACTUAL, (), "annotator", False, 2, "m", None, 320, 9),
            AnnotatedLabel("other/q9", Capability.FACTUAL, (), "annotator", False, 1, "m", None, 999, 9)]
    path = tmp_path / "labels.jsonl"
    path.write_text("".join(json.dumps(r.to_json()) + "\n" for r in rows))
    assert label_usage(str(path), {"train": [conv], "valid": [], "test": []}) == \
        {"annotator": {"calls": 3, "prompt": 470, "completion": 13}}
    assert label_usage("native", {"train": [conv]}) == {}


def test_a_state_with_a_skipped_integration_round_is_a_valid_run_state(tmp_path):
    """An integration round with nothing to merge books candidate "-" in the history; --resume must
    accept that state (it refused it as naming a missing candidate)."""
    from memgym.evolution.search.archive import Archive
    from memgym.evolution.search.rundir import RunStateError, check_state

    arch = Archive()
    st = {"format": 2, "archive": {**arch.to_json(), "candidates": [{"id": "seed"}], "base": "seed",
                                   "specialists": {}},
          "ledger": {"rounds": {}, "budgets": {}}, "rng": [3, [0] * 625, None], "next_round": 11, "elapsed_s": 1.0,
          "recipe": {}, "history": [{"round": 0, "candidate": "seed"},
                                    {"round": 9, "stage": "integrate", "candidate": "-"}]}
    assert check_state(st, tmp_path / "state.json") is st
    st["history"].append({"round": 10, "candidate": "r10"})
    import pytest
    with pytest.raises(RunStateError, match="does not hold: r10"):
        check_state(st, tmp_path / "state.json")


def test_a_run_state_of_an_older_format_is_refused_naming_the_file(tmp_path):
    """state.json of format 1 (scores inline, untyped history) is not resumed: one typed error."""
    import pytest

    from memgym.evolution.search.rundir import RunStateError, check_state

    st = {"archive": {"candidates": [{"id": "seed", "valid": {"overall": 0.5}}]}, "history": [], "next_round": 2}
    with pytest.raises(RunStateError) as e:
        check_state(st, tmp_path / "state.json")
    assert str(e.value) == (f"{tmp_path / 'state.json'}: a run state of format 1; this memgym resumes format 2 only "
                            "(a run of an older memgym): start a new run in another folder")
    assert e.value.kind == "usage"
