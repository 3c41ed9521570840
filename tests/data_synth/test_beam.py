"""BEAM loader on the shipped chats (``../shared/data/beam``): exact counts, evidence, dates,
switches, quirks and broken files."""
from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import pytest

from memgym.data_synth.beam import BEAM_ABILITIES, beam_root, flatten_ids, load_beam, load_beam_chat, strip_plan_markers
from memgym.data_synth.capabilities import count_by_capability
from memgym.data_synth.datasets import dataset_stats, load_conversations
from memgym.data_synth.errors import DataFormatError, DataQuirkWarning
from memgym.data_synth.paths import data_root
from memgym.data_synth.splits import split_ids
from memgym.llm.errors import ConfigError


@pytest.fixture(scope="module")
def all_chats():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        return load_beam()


def test_100k_chat_3_counts():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        c = load_beam_chat(beam_root() / "100K" / "3")
    assert c.id == "100K-3" and c.speakers == ("user", "assistant")
    assert [(s.id, s.date_text, len(s.turns)) for s in c.sessions] == [
        ("batch-1", "March-15-2024", 58), ("batch-2", "April-10-2024", 64), ("batch-3", "May-05-2024", 72)]
    assert c.n_turns() == 194 and len(c.questions) == 20
    assert [q.category for q in c.questions] == [a for a in BEAM_ABILITIES for _ in (1, 2)]
    assert count_by_capability(c.questions) == {"F": 2, "T": 6, "P": 4, "M": 4, "A": 4}
    qs = {q.id: q for q in c.questions}
    ku = qs["100K-3:knowledge_update:1"]  # source_chat_ids is {original_info: [12], updated_info: [52]}
    assert ku.evidence == ("12", "52") and ku.answer and len(ku.rubric) == 1
    assert qs["100K-3:abstention:1"].evidence == () and qs["100K-3:abstention:1"].answer.startswith("Based on")
    assert len(qs["100K-3:summarization:1"].evidence) == 16
    assert qs["100K-3:event_ordering:1"].rubric == ("Basic responsive components setup",
                                                    "Styling classes integration with custom CSS",
                                                    "Modal bug fix and upgrade concerns")
    assert sum(len(q.rubric) for q in c.questions) == 48
    assert c.sessions[0].turns[0].text.endswith("international team members?")


def test_1m_chat_3_counts():
    c = load_beam(beam_root() / "1M" / "3")[0]
    assert (c.id, len(c.sessions), c.n_turns(), len(c.questions)) == ("1M-3", 10, 1556, 20)


def test_all_chats_evidence_and_dates(all_chats):
    assert len(all_chats) == 26
    assert sum(len(c.sessions) for c in all_chats) == 156 and sum(c.n_turns() for c in all_chats) == 18516
    assert sum(len(c.questions) for c in all_chats) == 520
    assert sum(len(q.evidence) for c in all_chats for q in c.questions) == 1918
    for c in all_chats:
        ids = c.turn_index
        assert all(e in ids for q in c.questions for e in q.evidence), c.id
        dates = [s.date for s in c.sessions]
        assert all(d is not None for d in dates) and dates == sorted(dates), c.id
        assert not any("->->" in t.text for s in c.sessions for t in s.turns), c.id


def test_switches_truncated_and_markers():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        assert load_beam(beam_root() / "100K" / "5")[0].n_turns() == 232  # chat_trunecated.json
        assert load_beam(beam_root() / "100K" / "5", truncated=False)[0].n_turns() == 238
        kept = load_beam(beam_root() / "100K" / "3", strip_markers=False)[0]
    assert sum("->->" in t.text for s in kept.sessions for t in s.turns) == 78
    assert kept.sessions[0].turns[0].text.endswith("members? ->-> 1,1")


def test_strip_and_flatten():
    assert strip_plan_markers("Hi? ->-> 1,2") == "Hi?"
    assert strip_plan_markers("ok ->-> 3,N/A") == "ok"
    assert strip_plan_markers("a ->-> 7,9Please go") == "a Please go"
    assert strip_plan_markers("no marker ") == "no marker "
    assert flatten_ids({"a": [1, [2, 3]], "b": 4}, "f", "r", "source_chat_ids") == [1, 2, 3, 4]
    with pytest.raises(DataFormatError, match=r"source_chat_ids\['a'\]\[1\]"):
        flatten_ids({"a": [1, "x"]}, "f", "r", "source_chat_ids")


def test_quirks_one_summary_warning():
    with pytest.warns(DataQuirkWarning) as rec:
        load_beam(beam_root() / "1M")
    msgs = [str(w.message) for w in rec if issubclass(w.category, DataQuirkWarning)]
    assert len(msgs) == 1
    assert "20 odd difficulty spellings" in msgs[0] and "1 questions without source_chat_ids" in msgs[0]


def _copy_chat(tmp_path):
    dst = tmp_path / "100K" / "3"
    shutil.copytree(beam_root() / "100K" / "3", dst)
    return dst


def test_broken_files_name_file_record_field(tmp_path):
    dst = _copy_chat(tmp_path)
    chat = json.loads((dst / "chat.json").read_text())
    del chat[1]["turns"][0][1]["content"]
    mid = chat[1]["turns"][0][1]["id"]
    (dst / "chat.json").write_text(json.dumps(chat))
    with pytest.raises(DataFormatError) as ei:
        load_beam(dst)
    assert (ei.value.record, ei.value.field) == (f"message {mid}", "content") and ei.value.file.endswith("chat.json")
    (dst / "chat.json").write_text("[{")
    with pytest.raises(DataFormatError, match="invalid JSON"):
        load_beam(dst)
    shutil.rmtree(dst)
    dst = _copy_chat(tmp_path)
    pq = dst / "probing_questions" / "probing_questions.json"
    data = json.loads(pq.read_text())
    del data["knowledge_update"][1]["answer"]
    pq.write_text(json.dumps(data))
    with pytest.raises(DataFormatError) as ei:
        load_beam(dst)
    assert (ei.value.record, ei.value.field) == ("knowledge_update[1]", "answer")


def test_splits_and_stats():
    assert split_ids("beam", "train") == [f"100K-{n}" for n in range(3, 11)]
    assert split_ids("beam", "test") == ["1M-3", "1M-4", "1M-6", "1M-7", "1M-8", "1M-9", "1M-10", "1M-31"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        valid = load_conversations("beam", split="valid")
        one = load_conversations("beam", beam_root() / "100K" / "3", split="train")
    assert [c.id for c in valid] == [f"100K-{n}" for n in range(11, 17)]
    st = dataset_stats(one, "beam", with_ids=True)
    assert (st["conversations"], st["sessions"], st["turns"], st["questions"], st["rubric_items"]) == (1, 3, 194, 20, 48)
    assert st["ids"][:2] == ["100K-3:abstention:1", "100K-3:abstention:2"] and len(st["ids"]) == 20


def _beam_chat(tmp_path: Path, chat=None, questions=None) -> Path:
    src = data_root() / "beam" / "100K" / "3"
    dst = tmp_path / "beam" / "100K" / "3"
    shutil.copytree(src, dst)
    if chat is not None:
        (dst / "chat.json").write_text(json.dumps(chat))
    if questions is not None:
        (dst / "probing_questions" / "probing_questions.json").write_text(json.dumps(questions))
    return dst


@pytest.mark.parametrize("chat, questions, what", [
    ([], None, "chat.json, record -, field -: the chat holds no batches (an empty list): nothing to remember"),
    (None, {}, "probing_questions.json, record -, field -: no probing questions (an empty object or only empty "
               "lists): nothing to score"),
    (None, {"temporal_reasoning": []}, "probing_questions.json, record -, field -: no probing questions"),
])
def test_an_empty_beam_chat_or_question_file_is_refused(tmp_path, chat, questions, what):
    from memgym.data_synth.beam import load_beam_chat
    from memgym.data_synth.errors import DataFormatError

    folder = _beam_chat(tmp_path, chat, questions)
    with pytest.raises(DataFormatError) as e:
        load_beam_chat(folder)
    assert what in str(e.value)


def test_beam_selection_checks(tmp_path):
    from memgym.data_synth.datasets import check_selection, load_conversations

    folder = _beam_chat(tmp_path)
    for default in (["conv-30"], ["conv-26", "conv-30"]):  # the eval / program-eval recipe defaults
        convs = list(default)
        check_selection("beam", str(folder), convs, None, "rubric-recall")
        assert convs == ["100K-3"]  # the folder's chat, not the LoCoMo ids
    assert [c.id for c in load_conversations("beam", str(folder), ids=convs)] == ["100K-3"]
    size_folder = folder.parent
    convs = ["conv-30"]
    check_selection("beam", str(size_folder), convs, None, "answer-recall")
    assert convs == ["100K-3"]
    with pytest.raises(ConfigError, match=r"^--split train and --conversations 100K-4 both given: the split runs its "
                                          r"own ids and would ignore the conversations; give one of them$"):
        check_selection("beam", None, ["100K-4"], "train", "answer-recall")
    with pytest.raises(ConfigError, match=r"^--split test: none of its BEAM chats is under .*100K/3 \(found there: "
                                          r"100K-3\); nothing would be evaluated$"):
        check_selection("beam", str(folder), ["conv-30"], "test", "answer-recall")
    check_selection("beam", str(folder), ["conv-30"], "train", "answer-recall")  # 100K-3 is a train chat
    with pytest.raises(ConfigError, match="^--conversations is empty: nothing would be evaluated$"):
        check_selection("locomo", None, [], None, "answer-recall")
    with pytest.raises(ConfigError, match="^--split valid and --conversations conv-42 both given"):
        check_selection("locomo", None, ["conv-42"], "valid", "f1")
