"""Loader for LongMemEval (Wu et al., ICLR 2025; xiaowu0162/LongMemEval), oracle and S/M files
(schema: ``../shared/data/README.md`` § "LongMemEval schema"). Each record becomes one
:class:`Conversation` (id = ``question_id``, speakers user/assistant) with one :class:`QAItem`:

- sessions sorted by date string, stable, as the official ``src/generation/run_generation.py``
  does; ``Session.id`` the haystack id; turn ids ``<session_id>:<k>``, k 1-based;
- evidence = turns with ``has_answer: true``, else every turn of ``answer_session_ids``;
- ``answer`` a string, ``category`` the ``question_type``, capabilities from
  :mod:`memgym.data_synth.capabilities` (``_abs`` ids -> A). Quirks: one :class:`DataQuirkWarning` per file.
"""
from __future__ import annotations

from datetime import datetime
from pathlib import Path

from tqdm import tqdm

from memgym.data_synth.capabilities import LONGMEMEVAL_MAP, capability_for, secondary_for
from memgym.data_synth.errors import DataFormatError, QuirkLog, get_field, record_id
from memgym.data_synth.paths import longmemeval_oracle_path, read_json
from memgym.memory_bank.schema import Conversation, QAItem, Session, Turn
from memgym.llm.errors import ConfigError

#: ``haystack_dates`` / ``question_date`` format, e.g. "2023/05/30 (Tue) 23:40".
LONGMEMEVAL_DATE_FORMAT = "%Y/%m/%d (%a) %H:%M"
LONGMEMEVAL_SPEAKERS = ("user", "assistant")


def parse_longmemeval_date(text: str) -> datetime | None:
    """Parse ``"2023/05/30 (Tue) 23:40"`` (minute precision); ``None`` if it does not match
    :data:`LONGMEMEVAL_DATE_FORMAT` (the weekday is checked by ``strptime`` only for form)."""
    try:
        return datetime.strptime(" ".join(str(text).split()), LONGMEMEVAL_DATE_FORMAT)
    except ValueError:
        return None


def _str_list(rec: dict, key: str, file: Path, rid: str) -> list[str]:
    vals = get_field(rec, key, list, file, rid, key)
    for k, v in enumerate(vals):
        if not isinstance(v, str):
            raise DataFormatError(file, rid, f"{key}[{k}]", f"expected str, got "
                                                            f"{type(v).__name__}")
    return vals


def parse_longmemeval_record(file: Path | str, i: int, rec, quirks: QuirkLog) -> Conversation:
    """The ``i``-th record of ``file`` as a :class:`Conversation`. DataFormatError for a missing or
    mistyped field, an unknown ``question_type``, haystack lists of different lengths or a bad turn."""
    file = Path(file)
    rid = record_id(file, i, rec, "question_id")
    qtype = get_field(rec, "question_type", str, file, rid, "question_type")
    if qtype not in LONGMEMEVAL_MAP:
        raise DataFormatError(file, rid, "question_type", f"unknown type {qtype!r}; expected "
                                                          f"one of {', '.join(LONGMEMEVAL_MAP)}")
    question = get_field(rec, "question", str, file, rid, "question")
    answer = get_field(rec, "answer", (str, int, float), file, rid, "answer")
    if not isinstance(answer, str):
        quirks.add("non-string answers converted to str", f"{rid}: {answer!r}")
        answer = str(answer)
    qdate = get_field(rec, "question_date", str, file, rid, "question_date")
    sids = _str_list(rec, "haystack_session_ids", file, rid)
    dates = _str_list(rec, "haystack_dates", file, rid)
    hay = get_field(rec, "haystack_sessions", list, file, rid, "haystack_sessions")
    answer_sids = _str_list(rec, "answer_session_ids", file, rid)
    if not (len(sids) == len(dates) == len(hay)):
        raise DataFormatError(file, rid, "haystack_dates", f"lengths differ: "
                              f"{len(sids)} session ids, {len(dates)} dates, {len(hay)} sessions")

    order = sorted(range(len(hay)), key=lambda k: dates[k])  # stable, official date sort
    sessions: list[Session] = []
    used: dict[str, int] = {}
    turns_of: dict[str, list[str]] = {}  # original session id -> turn ids (all copies)
    has_answer: list[str] = []
    session_of_turn: dict[str, int] = {}
    for pos, k in enumerate(order, start=1):
        raw_sid = sids[k]
        used[raw_sid] = used.get(raw_sid, 0) + 1
        sid = raw_sid if used[raw_sid] == 1 else f"{raw_sid}#{used[raw_sid]}"
        if used[raw_sid] > 1:
            quirks.add("duplicate session ids renamed", f"{rid}: {sid}")
        raw_turns = hay[k]
        if not isinstance(raw_turns, list):
            raise DataFormatError(file, rid, f"haystack_sessions[{k}]", f"expected list, got "
                                                                        f"{type(raw_turns).__name__}")
        date = parse_longmemeval_date(dates[k])
        if date is None:
            quirks.add("unparseable session dates", f"{rid}: {dates[k]!r}")
        turns: list[Turn] = []
        for j, t in enumerate(raw_turns):
            fp = f"haystack_sessions[{k}][{j}]"
            role = get_field(t, "role", str, file, rid, f"{fp}.role")
            if role not in LONGMEMEVAL_SPEAKERS:
                raise DataFormatError(file, rid, f"{fp}.role", f"expected user or assistant, "
                                                               f"got {role!r}")
            content = get_field(t, "content", str, file, rid, f"{fp}.content")
            tid = f"{sid}:{j + 1}"
            turns.append(Turn(id=tid, speaker=role, text=content))
            session_of_turn[tid] = pos
            turns_of.setdefault(raw_sid, []).append(tid)
            if t.get("has_answer") is True:
                has_answer.append(tid)
        sessions.append(Session(index=pos, id=sid, date=date, date_text=dates[k],
                                turns=tuple(turns)))

    missing = [s for s in answer_sids if s not in turns_of and s not in used]
    if missing:
        quirks.add("answer_session_ids not in the haystack ignored", f"{rid}: {missing[0]}")
    if has_answer:
        evidence = tuple(has_answer)
    else:
        evidence = tuple(tid for s in dict.fromkeys(answer_sids) for tid in turns_of.get(s, []))
        if not evidence:
            quirks.add("questions without any evidence turn", rid)
    n_sess = len({session_of_turn[e] for e in evidence})
    qa = QAItem(id=rid, question=question, answer=answer, evidence=evidence, category=qtype,
                capability=capability_for("longmemeval", qtype, rid),
                secondary=secondary_for("longmemeval", qtype, rid, n_sess),
                question_date=qdate)
    return Conversation(id=rid, speakers=LONGMEMEVAL_SPEAKERS, sessions=tuple(sessions),
                        questions=(qa,))


def load_longmemeval(path: Path | str | None = None, question_ids: list[str] | None = None,
                     progress: bool = False) -> list[Conversation]:
    """LongMemEval questions of ``path`` (default :func:`memgym.data_synth.paths.longmemeval_oracle_path`),
    one Conversation each, in file order; ``question_ids`` keeps only those (ValueError lists
    missing ones). Raises DataFileNotFoundError, DataFormatError (incl. a duplicate id)."""
    p = Path(path) if path is not None else longmemeval_oracle_path()
    data = read_json(p, "LongMemEval file")
    if not isinstance(data, list):
        raise DataFormatError(p, "-", "-", f"expected a JSON list of questions, got "
                                           f"{type(data).__name__}")
    rids = [record_id(p, i, rec, "question_id") for i, rec in enumerate(data)]
    seen: set[str] = set()
    for i, r in enumerate(rids):
        if r in seen:
            raise DataFormatError(p, r, "question_id", f"duplicate question_id (record #{i})")
        seen.add(r)
    keep = None
    if question_ids is not None:
        keep = set(question_ids)
        missing = [q for q in dict.fromkeys(question_ids) if q not in seen]
        if missing:
            raise ConfigError(f"LongMemEval question ids not in {p}: {', '.join(missing)}")
    quirks = QuirkLog(p.name)
    out = [parse_longmemeval_record(p, i, rec, quirks)
           for i, (rid, rec) in enumerate(tqdm(list(zip(rids, data)), desc="LongMemEval",
                                               disable=not progress, unit="q"))
           if keep is None or rid in keep]
    quirks.emit(stacklevel=3)
    return out
