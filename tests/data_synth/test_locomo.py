"""LoCoMo loader: exact counts on the shipped file, quirk repair, broken-file errors, restrict."""
from __future__ import annotations

import copy
import json
import warnings
from collections import Counter
from datetime import datetime

import pytest

from memgym.data_synth.datasets import restrict
from memgym.data_synth.errors import DataFileNotFoundError, DataFormatError, DataQuirkWarning
from memgym.data_synth.locomo import LOCOMO_ABSTAIN_ANSWER, load_locomo, parse_locomo_date
from memgym.data_synth.paths import locomo_path
from memgym.memory_bank.schema import Capability


@pytest.fixture(scope="module")
def locomo():
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        convs = load_locomo()
    return convs, [w for w in caught if issubclass(w.category, DataQuirkWarning)]


@pytest.fixture(scope="module")
def raw_locomo():
    with open(locomo_path(), encoding="utf-8") as fh:
        return json.load(fh)


def test_shipped_counts(locomo):
    convs, _ = locomo
    assert len(convs) == 10
    assert sum(len(c.sessions) for c in convs) == 272
    assert sum(c.n_turns() for c in convs) == 5882
    qs = [q for c in convs for q in c.questions]
    assert len(qs) == 1986
    assert Counter(q.category for q in qs) == {"1": 282, "2": 321, "3": 96, "4": 841, "5": 446}
    assert Counter(q.capability for q in qs) == {
        Capability.MULTI_SESSION: 282, Capability.TEMPORAL: 321, Capability.PREFERENCE: 96,
        Capability.FACTUAL: 841, Capability.ADVERSARIAL: 446}
    assert all(isinstance(q.answer, str) for q in qs)
    assert len({q.id for q in qs}) == 1986


def test_one_warning_per_quirky_conversation(locomo):
    _, caught = locomo
    msgs = sorted(str(w.message) for w in caught)
    assert [m.split(":")[0] for m in msgs] == [
        "locomo10.json, conv-26", "locomo10.json, conv-42", "locomo10.json, conv-43",
        "locomo10.json, conv-47", "locomo10.json, conv-49", "locomo10.json, conv-50"]
    conv26 = msgs[0]
    assert "6 non-string answers converted to str" in conv26
    assert "1 evidence strings split" in conv26
    assert "2 items with empty evidence kept" in conv26


def test_conv26_structure(locomo):
    c = locomo[0][0]
    assert c.id == "conv-26" and c.speakers == ("Caroline", "Melanie")
    assert [s.index for s in c.sessions] == list(range(1, 20))  # 35 date keys, 19 sessions
    s1 = c.sessions[0]
    assert s1.id == "session_1" and s1.date_text == "1:56 pm on 8 May, 2023"
    assert s1.date == datetime(2023, 5, 8, 13, 56)
    assert len(s1.turns) == 18 and s1.turns[0].id == "D1:1"
    t = s1.turns[4]
    assert t.id == "D1:5" and t.speaker == "Caroline"
    assert t.image_caption == "a photo of a dog walking past a wall with a painting of a woman"
    assert sum(1 for s in c.sessions for t in s.turns if t.image_caption) > 0


def test_answers_and_evidence_quirks_on_real_file(locomo):
    qs = {q.id: q for c in locomo[0] for q in c.questions}
    q1 = qs["conv-26/q1"]
    assert (q1.question, q1.answer, q1.evidence, q1.category) == (
        "When did Melanie paint a sunrise?", "2022", ("D1:12",), "2")
    assert qs["conv-26/q37"].evidence == ("D8:6", "D9:17")          # "D8:6; D9:17" split
    assert "D11:26" in qs["conv-43/q4"].evidence                     # "D:11:26" repaired
    assert qs["conv-50/q69"].evidence == ("D30:5",)                  # "D30:05" repaired
    assert qs["conv-49/q31"].evidence == ("D9:1", "D4:4", "D4:6")
    assert qs["conv-49/q31"].capability is Capability.PREFERENCE
    assert qs["conv-49/q31"].secondary == (Capability.MULTI_SESSION,)
    known = {t.id for c in locomo[0] for s in c.sessions for t in s.turns}
    assert all(e in known for q in qs.values() for e in q.evidence)


def test_category5_gold_is_abstention(locomo, raw_locomo):
    qs = [q for c in locomo[0] for q in c.questions if q.category == "5"]
    assert len(qs) == 446
    assert {q.answer for q in qs} == {LOCOMO_ABSTAIN_ANSWER}
    assert {q.capability for q in qs} == {Capability.ADVERSARIAL}
    # the file's adversarial_answer (a distractor) is never used as the gold
    raw_qa = raw_locomo[0]["qa"]
    k = [q["category"] for q in raw_qa].index(5)
    loaded = {q.id: q for q in locomo[0][0].questions}[f"conv-26/q{k}"]
    assert loaded.question == raw_qa[k]["question"]
    assert loaded.answer == LOCOMO_ABSTAIN_ANSWER != raw_qa[k]["adversarial_answer"]


def test_ids_filter_and_unknown_id():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        convs = load_locomo(ids=["conv-30"])
    assert [c.id for c in convs] == ["conv-30"]
    assert len(convs[0].sessions) == 19
    with pytest.raises(ValueError, match=r"ids not in .*locomo10.json: conv-99 \(it holds conv-26, conv-30, conv-41, conv-42, conv-43, conv-44, conv-47, conv-48, conv-49, conv-50\)"):
        load_locomo(ids=["conv-30", "conv-99"])


def test_restrict_matches_raw_evidence(locomo, raw_locomo):
    c = locomo[0][0]
    raw = raw_locomo[0]["qa"]
    for n in (1, 3):
        heads = {f"D{k}" for k in range(1, n + 1)}
        expect = sum(1 for q in raw if q["evidence"]
                     and all(e.split(":")[0] in heads for e in q["evidence"]))
        r = restrict(c, n)
        assert len(r.sessions) == n
        assert len(r.questions) == expect
    assert (len(restrict(c, 1).questions), len(restrict(c, 3).questions)) == (4, 25)


# ---------------------------------------------------------------- crafted files


def _record(sample_id="conv-x"):
    return {
        "sample_id": sample_id,
        "conversation": {
            "speaker_a": "Ann", "speaker_b": "Bob",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ann", "dia_id": "D1:1", "text": "I adopted a cat."},
                {"speaker": "Bob", "dia_id": "D1:2", "text": "Look!", "blip_caption": "a dog",
                 "img_url": ["http://x"], "query": "dog"},
            ],
            "session_2_date_time": "sometime in spring",
            "session_2": [{"speaker": "Ann", "dia_id": "D2:1", "text": "The cat is Tom."}],
            "session_10": [{"speaker": "Bob", "dia_id": "D10:1", "text": "Bye."}],
        },
        "qa": [
            {"question": "Pet?", "answer": "a cat", "evidence": ["D1:1"], "category": 4},
            {"question": "How many?", "answer": 2, "evidence": ["D1:1; D2:1"], "category": 1},
            {"question": "Fix?", "answer": "x", "evidence": ["D:1:02", "D9:9", "D"], "category": 2},
            {"question": "Bob's cat?", "adversarial_answer": "Tom", "evidence": [], "category": 5},
        ],
        "observation": {"session_1_observation": "SHOULD NOT BE USED"},
        "session_summary": {"session_1_summary": "SHOULD NOT BE USED"},
    }


def _write(tmp_path, data, name="locomo.json"):
    p = tmp_path / name
    p.write_text(json.dumps(data), encoding="utf-8")
    return p


def test_crafted_quirks_give_one_summary_warning(tmp_path):
    p = _write(tmp_path, [_record()])
    with pytest.warns(DataQuirkWarning) as rec:
        (c,) = load_locomo(p)
    assert len(rec) == 1
    msg = str(rec[0].message)
    assert msg.startswith("locomo.json, conv-x: ")
    for part in ("1 gaps in session numbering", "1 sessions without a date",
                 "1 unparseable session dates", "1 non-string answers converted to str",
                 "1 evidence strings split", "1 malformed evidence ids repaired",
                 "2 unknown evidence ids dropped", "1 items with empty evidence kept"):
        assert part in msg
    assert [s.index for s in c.sessions] == [1, 2, 10]
    assert c.sessions[1].date is None and c.sessions[1].date_text == "sometime in spring"
    assert c.sessions[2].date is None and c.sessions[2].date_text == ""
    assert c.sessions[0].turns[1].image_caption == "a dog"
    assert c.n_turns() == 4
    q = c.questions
    assert [x.id for x in q] == ["conv-x/q0", "conv-x/q1", "conv-x/q2", "conv-x/q3"]
    assert q[1].answer == "2" and q[1].evidence == ("D1:1", "D2:1")
    assert q[1].secondary == ()  # primary is already M
    assert q[2].evidence == ("D1:2",)
    assert q[3].answer == LOCOMO_ABSTAIN_ANSWER and q[3].evidence == ()
    text = " ".join(t.text for s in c.sessions for t in s.turns)
    assert "SHOULD NOT BE USED" not in text


def test_restrict_crafted(tmp_path):
    p = _write(tmp_path, [_record()])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        (c,) = load_locomo(p)
    r1 = restrict(c, 1)
    assert [s.index for s in r1.sessions] == [1]
    assert [q.id for q in r1.questions] == ["conv-x/q0", "conv-x/q2"]
    r9 = restrict(c, 9)  # more than there are: all sessions; empty-evidence q3 still dropped
    assert len(r9.sessions) == 3
    assert [q.id for q in r9.questions] == ["conv-x/q0", "conv-x/q1", "conv-x/q2"]
    for bad in (0, -1, 1.5, True):
        with pytest.raises(ValueError, match="n_sessions"):
            restrict(c, bad)


def test_parse_date():
    assert parse_locomo_date("12:09 am on 13 September, 2023") == datetime(2023, 9, 13, 0, 9)
    assert parse_locomo_date("8 May 2023") is None


@pytest.mark.parametrize("mutate, record, field", [
    (lambda r: r.pop("conversation"), "conv-x", "conversation"),
    (lambda r: r.pop("sample_id"), "#1", "sample_id"),
    (lambda r: r.pop("qa"), "conv-x", "qa"),
    (lambda r: r["conversation"]["session_1"][1].pop("dia_id"), "conv-x",
     "conversation.session_1[1].dia_id"),
    (lambda r: r["conversation"]["session_2"][0].pop("text"), "conv-x",
     "conversation.session_2[0].text"),
    (lambda r: r["conversation"].__setitem__("session_2", "oops"), "conv-x",
     "conversation.session_2"),
    (lambda r: r["qa"][0].pop("answer"), "conv-x", "qa[0].answer"),
    (lambda r: r["qa"][2].__setitem__("category", 7), "conv-x", "qa[2].category"),
    (lambda r: r["qa"][1].pop("question"), "conv-x", "qa[1].question"),
    (lambda r: r["conversation"]["session_2"][0].__setitem__("dia_id", "D1:1"), "conv-x",
     "conversation.session_2[0].dia_id"),
])
def test_broken_record_names_file_record_field(tmp_path, mutate, record, field):
    good = _record()
    bad = copy.deepcopy(good)
    mutate(bad)
    p = _write(tmp_path, [good | {"sample_id": "conv-ok"}, bad])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        with pytest.raises(DataFormatError) as ei:
            load_locomo(p)
    e = ei.value
    assert (e.file, e.record, e.field) == (str(p), record, field)
    assert str(e).startswith(f"file {p}, record {e.record}, field {field}: ")


def test_bad_json_and_bad_top_level(tmp_path):
    p = tmp_path / "bad.json"
    p.write_text('[{"sample_id": "conv-1",', encoding="utf-8")
    with pytest.raises(DataFormatError, match=r"record -, field -: invalid JSON at line 1") as ei:
        load_locomo(p)
    assert ei.value.file == str(p)
    q = _write(tmp_path, {"sample_id": "conv-1"}, "obj.json")
    with pytest.raises(DataFormatError, match="expected a JSON list"):
        load_locomo(q)


def test_missing_file_says_where(tmp_path):
    p = tmp_path / "nope" / "locomo10.json"
    with pytest.raises(DataFileNotFoundError) as ei:
        load_locomo(p)
    assert str(p) in str(ei.value) and "MEMGYM_DATA" in str(ei.value)
