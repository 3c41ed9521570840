"""LongMemEval loader: exact counts on the oracle file, haystack (S-format) file, errors."""
from __future__ import annotations

import copy
import json
import warnings
from collections import Counter
from datetime import datetime

import pytest

from memgym.data_synth.errors import DataFormatError, DataQuirkWarning
from memgym.data_synth.longmemeval import load_longmemeval, parse_longmemeval_date
from memgym.data_synth.paths import longmemeval_oracle_path
from memgym.memory_bank.schema import Capability


@pytest.fixture(scope="module")
def oracle():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convs = load_longmemeval()
    return convs, [w for w in caught if issubclass(w.category, DataQuirkWarning)]


@pytest.fixture(scope="module")
def raw_oracle():
    with open(longmemeval_oracle_path(), encoding="utf-8") as fh:
        return {r["question_id"]: r for r in json.load(fh)}


def test_oracle_counts(oracle):
    convs, caught = oracle
    assert len(convs) == 500
    assert sum(len(c.sessions) for c in convs) == 948
    assert sum(c.n_turns() for c in convs) == 10960
    qs = [q for c in convs for q in c.questions]
    assert len(qs) == 500 and all(len(c.questions) == 1 for c in convs)
    assert Counter(q.category for q in qs) == {
        "single-session-user": 70, "single-session-assistant": 56,
        "single-session-preference": 30, "multi-session": 133, "temporal-reasoning": 133,
        "knowledge-update": 78}
    abst = [q for q in qs if q.id.endswith("_abs")]
    assert len(abst) == 30
    assert {q.capability for q in abst} == {Capability.ADVERSARIAL}
    assert sum(q.capability is Capability.ADVERSARIAL for q in qs) == 30
    # F 70+56-6 ssu _abs; T 133+78-6-6 (tr/ku _abs); P 30; M 133-12 ms _abs
    assert Counter(q.capability.value for q in qs) == {"F": 120, "T": 199, "P": 30, "M": 121,
                                                       "A": 30}
    assert all(isinstance(q.answer, str) for q in qs)
    assert len(caught) == 1
    assert str(caught[0].message).startswith(
        "longmemeval_oracle.json: 32 non-string answers converted to str")


def test_oracle_record_001be529(oracle):
    c = next(c for c in oracle[0] if c.id == "001be529")
    assert c.speakers == ("user", "assistant")
    (s,) = c.sessions
    assert (s.index, s.id, s.date_text) == (1, "answer_530960c1", "2023/05/21 (Sun) 19:50")
    assert s.date == datetime(2023, 5, 21, 19, 50)
    assert s.turns[0].id == "answer_530960c1:1" and s.turns[0].speaker == "user"
    (q,) = c.questions
    assert (q.id, q.answer, q.category, q.question_date) == (
        "001be529", "over a year", "single-session-user", "2023/05/28 (Sun) 19:47")
    assert q.evidence == ("answer_530960c1:5",)
    assert q.capability is Capability.FACTUAL and q.secondary == ()


def test_sessions_sorted_by_date_and_evidence_rule(oracle, raw_oracle):
    reordered = 0
    fallback = 0
    for c in oracle[0]:
        raw = raw_oracle[c.id]
        texts = [s.date_text for s in c.sessions]
        assert texts == sorted(raw["haystack_dates"])
        reordered += [s.id for s in c.sessions] != raw["haystack_session_ids"]
        has = [f"{sid}:{j + 1}" for sid, sess in zip(raw["haystack_session_ids"],
                                                     raw["haystack_sessions"])
               for j, t in enumerate(sess) if t.get("has_answer")]
        (q,) = c.questions
        if has:
            assert set(q.evidence) == set(has)
        else:
            fallback += 1
            expect = {t.id for s in c.sessions if s.id in raw["answer_session_ids"]
                      for t in s.turns}
            assert set(q.evidence) == expect and expect
    assert (reordered, fallback) == (34, 21)


def test_abstention_secondary_is_type_capability(oracle):
    qs = {q.id: q for c in oracle[0] for q in c.questions}
    abst = [q for q in qs.values() if q.id.endswith("_abs")]
    ms = [q for q in abst if q.category == "multi-session"]
    assert len(ms) == 12 and all(q.secondary == (Capability.MULTI_SESSION,) for q in ms)
    ssu = [q for q in abst if q.category == "single-session-user"]
    assert len(ssu) == 6 and all(q.secondary[0] is Capability.FACTUAL for q in ssu)


def test_question_id_filter(oracle):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        convs = load_longmemeval(question_ids=["001be529"])
    assert [c.id for c in convs] == ["001be529"]
    with pytest.raises(ValueError, match="nope_q"):
        load_longmemeval(question_ids=["001be529", "nope_q"])


# ---------------------------------------------------------------- crafted S-format file


def _haystack_record(qid="q_abs"):
    """S-format record: distractor sessions without has_answer keys, out of date order."""
    return {
        "question_id": qid, "question_type": "knowledge-update",
        "question": "Where do I live now?", "answer": 7,
        "question_date": "2023/06/01 (Thu) 10:00",
        "haystack_session_ids": ["sharegpt_a_0", "answer_x_1", "ultrachat_b"],
        "haystack_dates": ["2023/05/20 (Sat) 09:00", "2023/05/01 (Mon) 08:30",
                           "2023/05/25 (Thu) 12:00"],
        "haystack_sessions": [
            [{"role": "user", "content": "Write a poem."},
             {"role": "assistant", "content": "Roses..."}],
            [{"role": "user", "content": "I moved to Oslo.", "has_answer": True},
             {"role": "assistant", "content": "Nice!", "has_answer": False},
             {"role": "user", "content": "Oslo is cold.", "has_answer": True}],
            [{"role": "user", "content": "Explain GRPO."}],
        ],
        "answer_session_ids": ["answer_x_1"],
    }


def _write(tmp_path, data, name="longmemeval_s.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


def test_haystack_file(tmp_path):
    other = _haystack_record("q2")
    other["answer"] = "Oslo"
    for s in other["haystack_sessions"]:
        for t in s:
            t.pop("has_answer", None)
    p = _write(tmp_path, [_haystack_record(), other])
    with pytest.warns(DataQuirkWarning) as rec:
        convs = load_longmemeval(p, progress=False)
    assert len(rec) == 1 and "1 non-string answers converted to str (e.g. q_abs: 7)" in \
        str(rec[0].message)
    c, c2 = convs
    assert [s.id for s in c.sessions] == ["answer_x_1", "sharegpt_a_0", "ultrachat_b"]
    assert [s.index for s in c.sessions] == [1, 2, 3]
    assert c.n_turns() == 6
    (q,) = c.questions
    assert q.answer == "7"
    assert q.evidence == ("answer_x_1:1", "answer_x_1:3")
    assert q.capability is Capability.ADVERSARIAL and q.secondary == (Capability.TEMPORAL,)
    (q2,) = c2.questions  # no has_answer anywhere -> every turn of the answer session
    assert q2.evidence == ("answer_x_1:1", "answer_x_1:2", "answer_x_1:3")
    assert q2.capability is Capability.TEMPORAL and q2.secondary == ()


def test_duplicate_session_ids_are_renamed(tmp_path):
    r = _haystack_record("q1")
    r["haystack_session_ids"][2] = "sharegpt_a_0"
    with pytest.warns(DataQuirkWarning, match="1 duplicate session ids renamed"):
        (c,) = load_longmemeval(_write(tmp_path, [r]))
    assert [s.id for s in c.sessions] == ["answer_x_1", "sharegpt_a_0", "sharegpt_a_0#2"]
    assert c.sessions[2].turns[0].id == "sharegpt_a_0#2:1"


@pytest.mark.parametrize("mutate, field", [
    (lambda r: r.pop("question"), "question"),
    (lambda r: r.pop("answer_session_ids"), "answer_session_ids"),
    (lambda r: r.__setitem__("question_type", "trivia"), "question_type"),
    (lambda r: r["haystack_dates"].pop(), "haystack_dates"),
    (lambda r: r["haystack_sessions"][1][0].__setitem__("role", "system"),
     "haystack_sessions[1][0].role"),
    (lambda r: r["haystack_sessions"][2][0].pop("content"), "haystack_sessions[2][0].content"),
    (lambda r: r["haystack_sessions"].__setitem__(0, {"role": "user"}), "haystack_sessions[0]"),
    (lambda r: r["haystack_session_ids"].__setitem__(1, 5), "haystack_session_ids[1]"),
    (lambda r: r.__setitem__("answer", ["x"]), "answer"),
])
def test_broken_record_names_file_record_field(tmp_path, mutate, field):
    bad = copy.deepcopy(_haystack_record("q_bad"))
    mutate(bad)
    p = _write(tmp_path, [_haystack_record("q_ok"), bad])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        with pytest.raises(DataFormatError) as ei:
            load_longmemeval(p)
    e = ei.value
    assert (e.file, e.record, e.field) == (str(p), "q_bad", field)
    assert str(e).startswith(f"file {p}, record q_bad, field {field}: ")


def test_bad_json_missing_id_and_duplicates(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('[{"question_id": "a"}, ', encoding="utf-8")
    with pytest.raises(DataFormatError, match="invalid JSON at line 1"):
        load_longmemeval(p)
    r = _haystack_record()
    r.pop("question_id")
    with pytest.raises(DataFormatError) as ei:
        load_longmemeval(_write(tmp_path, [r], "noid.json"))
    assert (ei.value.record, ei.value.field) == ("#0", "question_id")
    with pytest.raises(DataFormatError, match="duplicate question_id"):
        load_longmemeval(_write(tmp_path, [_haystack_record(), _haystack_record()], "dup.json"))


def test_parse_date():
    assert parse_longmemeval_date("2023/05/30 (Tue) 23:40") == datetime(2023, 5, 30, 23, 40)
    assert parse_longmemeval_date("May 30 2023") is None
