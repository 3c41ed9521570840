"""Loader for LoCoMo (``locomo10.json``, snap-research/LoCoMo, Maharana et al., ACL 2024); schema:
``../shared/data/README.md`` § "LoCoMo schema". Only ``sample_id``, ``conversation`` and ``qa`` are
read (the summaries/observations are model-made and never memory).

Quirks are repaired with one :class:`DataQuirkWarning` per conversation: int answers become
strings (as the official scorer does), multi-id evidence strings are split, malformed ids repaired
when unambiguous, unknown ids dropped; an unparsable session date gives ``date=None``.
Category 5 (adversarial): the official scorer (``task_eval/evaluation.py``) scores 1 iff the
prediction abstains, so every such item gets ``answer = LOCOMO_ABSTAIN_ANSWER``.
"""
from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from memgym.data_synth.capabilities import capability_for, secondary_for
from memgym.data_synth.errors import DataFormatError, QuirkLog, get_field, record_id
from memgym.data_synth.paths import locomo_path, read_json
from memgym.memory_bank.schema import Conversation, QAItem, Session, Turn
from memgym.llm.errors import ConfigError

#: Gold answer stored for every category-5 item (the official "option (a)" text).
LOCOMO_ABSTAIN_ANSWER = "Not mentioned in the conversation"
#: ``session_N_date_time`` format, e.g. "1:56 pm on 8 May, 2023".
LOCOMO_DATE_FORMAT = "%I:%M %p on %d %B, %Y"

_SESSION_KEY = re.compile(r"session_(\d+)")
_EVIDENCE_ID = re.compile(r"D\s*:?\s*(\d+)\s*:\s*(\d+)")
_EVIDENCE_SPLIT = re.compile(r"[;,\s]+")


def parse_locomo_date(text: str) -> datetime | None:
    """``"1:56 pm on 8 May, 2023"`` -> naive datetime (whitespace tolerated); None when it does not parse."""
    cleaned = " ".join(str(text).split())
    try:
        return datetime.strptime(cleaned, LOCOMO_DATE_FORMAT)
    except ValueError:
        return None


def normalise_evidence(raw: list, known: set[str], quirks: QuirkLog, where: str) -> tuple[str, ...]:
    """The ids of ``raw`` evidence found in ``known`` (order kept, deduplicated): strings split on
    ``;``/``,``/whitespace, ids repaired to ``D<N>:<k>``, others dropped; each fix logged in ``quirks``."""
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
    """The ``i``-th record of ``file`` as a :class:`Conversation`: sessions ``session_N`` (index N),
    turn ids the ``dia_id`` s (images: ``blip_caption``), QA ids ``"<sample_id>/q<i>"``, category
    "1".."5". DataFormatError for a missing/mistyped field, a bad category or a duplicate ``dia_id``."""
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
    """LoCoMo conversations of ``path`` (default :func:`memgym.data_synth.paths.locomo_path`) in file
    order; ``ids`` keeps only those ``sample_id`` s (ValueError lists missing ones). Raises
    DataFileNotFoundError, DataFormatError (file, record, field)."""
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
            raise ConfigError(f"LoCoMo ids not in {p}: {', '.join(missing)} (it holds {', '.join(rids)})")
    keep = None if wanted is None else set(wanted)
    out: list[Conversation] = []
    for i, (rid, rec) in enumerate(zip(rids, data)):  # a plain loop: warnings point at caller
        if keep is None or rid in keep:
            out.append(parse_locomo_record(p, i, rec))
    return out
