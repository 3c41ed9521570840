"""Loader for LoCoMo (``locomo10.json``, snap-research/LoCoMo, Maharana et al., ACL 2024).

Schema (``../shared/data/README.md`` § "LoCoMo schema"): a list of records
``{sample_id, conversation, qa, observation, session_summary, event_summary}``. Only
``sample_id``, ``conversation`` and ``qa`` are read: ``observation``, ``session_summary`` and
``event_summary`` are model-made annotations and must not be used as memory.

Quirks of the real file, repaired with one :class:`DataQuirkWarning` per conversation that
summarises the counts (never a crash):

- int answers (6 in conv-26) become strings, as the official scorer does (``str(answer)``);
- evidence strings holding several ids (``"D8:6; D9:17"``, ``"D9:1 D4:4 D4:6"``) are split;
- malformed ids are repaired when unambiguous (``"D:11:26"`` -> ``"D11:26"``,
  ``"D30:05"`` -> ``"D30:5"``);
- ids absent from the conversation (``"D10:19"``, ``"D"``) are dropped; items with empty
  evidence are kept with ``evidence=()``;
- a session date that does not parse gives ``date=None`` (``date_text`` keeps the raw text).

Category 5 (adversarial): the official scorer (``task_eval/evaluation.py``) ignores the gold
text and scores 1 iff the prediction says "no information available" or "not mentioned"; the
file's ``adversarial_answer`` is the *distractor* offered against "Not mentioned in the
conversation" in the multiple-choice prompt. So every category-5 item gets
``answer = LOCOMO_ABSTAIN_ANSWER`` (``adversarial_answer``/``answer`` are not gold).
"""
from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from data_synth.capabilities import capability_for, secondary_for
from data_synth.errors import DataFormatError, QuirkLog, get_field, record_id
from data_synth.paths import locomo_path, read_json
from memory_bank.schema import Conversation, QAItem, Session, Turn
from llm.errors import ConfigError

#: Gold answer stored for every category-5 item (the official "option (a)" text).
LOCOMO_ABSTAIN_ANSWER = "Not mentioned in the conversation"
#: ``session_N_date_time`` format, e.g. "1:56 pm on 8 May, 2023".
LOCOMO_DATE_FORMAT = "%I:%M %p on %d %B, %Y"

_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")


def parse_locomo_date(text: str) -> datetime | None:
    """Parse ``"1:56 pm on 8 May, 2023"`` (minute precision, naive local time).

    Returns ``None`` when the text does not match :data:`LOCOMO_DATE_FORMAT` (surrounding
    whitespace and repeated spaces are tolerated)."""
    cleaned = " ".join(str(text).split())
    try:
        return datetime.strptime(cleaned, LOCOMO_DATE_FORMAT)
    except ValueError:
        return None


def normalise_evidence(raw: list, known: set[str], quirks: QuirkLog, where: str) -> tuple[str, ...]:
    """Turn LoCoMo's raw evidence list into known turn ids (order kept, duplicates removed).

    Args:
        raw: the ``evidence`` list as found in the file (strings expected).
        known: the conversation's ``dia_id`` set.
        quirks: receives one entry per split string, repaired id and dropped id.
        where: the item id, used in quirk examples.

    Returns:
        The valid ids. Splits on ``;``, ``,`` and whitespace; repairs ``D:11:26``-style and
        zero-padded ids via the pattern ``D<N>:<k>``; drops non-strings and unknown ids.
    """
    out: list[str] = []
    for item in raw:
        if not isinstance(item, str):
            quirks.add("non-string evidence entries dropped", f"{where}: {item!r}")
            continue
        tokens = [t for t in _EVIDENCE_SPLIT.split(item.strip()) if t]
        if len(tokens) > 1:
            quirks.add("evidence strings split", repr(item))
        for tok in tokens:
            cand = tok
            if cand not in known:
                m = _EVIDENCE_ID.fullmatch(tok)
                if m:
                    cand = f"D{int(m.group(1))}:{int(m.group(2))}"
                    if cand in known:
                        quirks.add("malformed evidence ids repaired", f"{tok!r}->{cand!r}")
            if cand not in known:
                quirks.add("unknown evidence ids dropped", f"{where}: {tok!r}")
                continue
            if cand not in out:
                out.append(cand)
    return tuple(out)


def _parse_sessions(file: Path, rid: str, conv: dict, quirks: QuirkLog) -> list[Session]:
    numbered: list[tuple[int, str]] = []
    for key in conv:
        m = _SESSION_KEY.fullmatch(key)
        if m:
            numbered.append((int(m.group(1)), key))
    if not numbered:
        raise DataFormatError(file, rid, "conversation.session_1", "no session_N keys found")
    numbered.sort()
    if [n for n, _ in numbered] != list(range(1, len(numbered) + 1)):
        quirks.add("gaps in session numbering", ",".join(str(n) for n, _ in numbered))
    sessions: list[Session] = []
    seen: set[str] = set()
    for n, key in numbered:
        turns_raw = get_field(conv, key, list, file, rid, f"conversation.{key}")
        date_text = get_field(conv, f"{key}_date_time", str, file, rid,
                              f"conversation.{key}_date_time", optional=True)
        if date_text is None:
            quirks.add("sessions without a date", key)
            date_text = ""
            date = None
        else:
            date = parse_locomo_date(date_text)
            if date is None:
                quirks.add("unparseable session dates", repr(date_text))
        turns: list[Turn] = []
        for k, t in enumerate(turns_raw):
            fp = f"conversation.{key}[{k}]"
            dia = get_field(t, "dia_id", str, file, rid, f"{fp}.dia_id")
            speaker = get_field(t, "speaker", str, file, rid, f"{fp}.speaker")
            text = get_field(t, "text", str, file, rid, f"{fp}.text")
            caption = get_field(t, "blip_caption", str, file, rid, f"{fp}.blip_caption",
                                optional=True)
            if dia in seen:
                raise DataFormatError(file, rid, f"{fp}.dia_id", f"duplicate dia_id {dia!r}")
            seen.add(dia)
            turns.append(Turn(id=dia, speaker=speaker, text=text, image_caption=caption or None))
        sessions.append(Session(index=n, id=key, date=date, date_text=date_text,
                                turns=tuple(turns)))
    return sessions


def _parse_qa(file: Path, rid: str, qa_raw: list, sessions: list[Session],
              quirks: QuirkLog) -> list[QAItem]:
    turn_session = {t.id: s.index for s in sessions for t in s.turns}
    known = set(turn_session)
    out: list[QAItem] = []
    for i, q in enumerate(qa_raw):
        fp = f"qa[{i}]"
        qid = f"{rid}/q{i}"
        question = get_field(q, "question", str, file, rid, f"{fp}.question")
        cat_raw = get_field(q, "category", (int, str), file, rid, f"{fp}.category")
        cat = str(cat_raw).strip()
        if cat not in {"1", "2", "3", "4", "5"}:
            raise DataFormatError(file, rid, f"{fp}.category", f"expected 1..5, got {cat_raw!r}")
        if cat == "5":
            answer = LOCOMO_ABSTAIN_ANSWER
        else:
            ans = get_field(q, "answer", (str, int, float), file, rid, f"{fp}.answer")
            if not isinstance(ans, str):
                quirks.add("non-string answers converted to str", f"{qid}: {ans!r}")
                ans = str(ans)
            answer = ans
        ev_raw = get_field(q, "evidence", list, file, rid, f"{fp}.evidence")
        evidence = normalise_evidence(ev_raw, known, quirks, qid)
        if not ev_raw:
            quirks.add("items with empty evidence kept", qid)
        elif not evidence:
            quirks.add("items left with no valid evidence (kept)", qid)
        n_sess = len({turn_session[e] for e in evidence})
        out.append(QAItem(
            id=qid, question=question, answer=answer, evidence=evidence, category=cat,
            capability=capability_for("locomo", cat),
            secondary=secondary_for("locomo", cat, qid, n_sess),
            question_date=None,
        ))
    return out


def parse_locomo_record(file: Path | str, i: int, rec) -> Conversation:
    """Convert one LoCoMo record (the ``i``-th of ``file``) to a :class:`Conversation`.

    Speakers are ``(speaker_a, speaker_b)``; sessions come from the ``session_N`` keys in
    numeric order with ``Session.index = N`` and ``Session.id = "session_N"``; turn ids are
    the ``dia_id`` values; image turns carry ``blip_caption`` as ``image_caption``. QA ids
    are ``"<sample_id>/q<i>"`` (0-based position in ``qa``), ``category`` is "1".."5",
    ``question_date`` is ``None``. Emits at most one :class:`DataQuirkWarning`.

    Raises:
        DataFormatError: a required key is missing or has the wrong type (``sample_id``,
            ``conversation``, ``speaker_a``/``speaker_b``, ``session_N``, a turn's
            ``dia_id``/``speaker``/``text``, ``qa``, a QA item's ``question``/``category``/
            ``evidence``, ``answer`` for categories 1-4), a category outside 1..5, or a
            duplicate ``dia_id``. Nothing is returned half-parsed.
    """
    file = Path(file)
    rid = record_id(file, i, rec, "sample_id")
    conv = get_field(rec, "conversation", dict, file, rid, "conversation")
    qa_raw = get_field(rec, "qa", list, file, rid, "qa")
    speakers = (get_field(conv, "speaker_a", str, file, rid, "conversation.speaker_a"),
                get_field(conv, "speaker_b", str, file, rid, "conversation.speaker_b"))
    quirks = QuirkLog(f"{file.name}, {rid}")
    sessions = _parse_sessions(file, rid, conv, quirks)
    questions = _parse_qa(file, rid, qa_raw, sessions, quirks)
    quirks.emit(stacklevel=4)
    return Conversation(id=rid, speakers=speakers, sessions=tuple(sessions),
                        questions=tuple(questions))


def load_locomo(path: Path | str | None = None, ids: list[str] | None = None) -> list[Conversation]:
    """Load LoCoMo conversations in file order.

    Args:
        path: the ``locomo10.json`` file; default :func:`data_synth.paths.locomo_path`.
        ids: keep only these ``sample_id`` values (e.g. ``["conv-26"]``); ``None`` = all.
            Records not selected are only checked for a valid ``sample_id``.

    Returns:
        One :class:`Conversation` per selected record. The shipped file gives 10
        conversations, 272 sessions, 5,882 turns and 1,986 QA (categories 1:282, 2:321,
        3:96, 4:841, 5:446).

    Raises:
        DataFileNotFoundError: the file is absent (message says where it was expected).
        DataFormatError: bad JSON, a top level that is not a list, or a broken record (see
            :func:`parse_locomo_record`); the error names file, record and field.
        ValueError: an id in ``ids`` is not in the file (all missing ids are listed).
    """
    p = Path(path) if path is not None else locomo_path()
    data = read_json(p, "LoCoMo file")
    if not isinstance(data, list):
        raise DataFormatError(p, "-", "-", f"expected a JSON list of conversations, got "
                                           f"{type(data).__name__}")
    wanted = None if ids is None else list(dict.fromkeys(ids))
    rids = [record_id(p, i, rec, "sample_id") for i, rec in enumerate(data)]
    if wanted is not None:
        present = set(rids)
        missing = [x for x in wanted if x not in present]
        if missing:
            raise ConfigError(f"LoCoMo ids not in {p}: {', '.join(missing)}")
    keep = None if wanted is None else set(wanted)
    out: list[Conversation] = []
    for i, (rid, rec) in enumerate(zip(rids, data)):  # a plain loop: warnings point at caller
        if keep is None or rid in keep:
            out.append(parse_locomo_record(p, i, rec))
    return out
