"""Loader for BEAM (Tavakoli et al.; mohammadtavakoli78/BEAM, CC BY-SA 4.0); schema and quirks:
``../shared/data/beam/README.md``. A chat folder ``<size>/<n>/`` becomes one :class:`Conversation`
(id ``"<size>-<n>"``, speakers user/assistant); a batch is a session (``"batch-<number>"``, dated by
its first user message's ``time_anchor``); a message is a turn (id = message id). ``chat_trunecated.json``
(sic) is read when present, as the official pipeline does. ``" ->-> b,k"`` plan markers are stripped.
The probing questions become :class:`QAItem` s (id ``"<chat>:<ability>:<k>"``, the ability's
reference answer, rubric, evidence = every id in ``source_chat_ids``, capability by
:data:`memgym.data_synth.capabilities.BEAM_MAP`). Quirks go into one :class:`DataQuirkWarning` per load;
broken files raise :class:`DataFormatError` naming file, record and field.
"""
from __future__ import annotations

import re
from datetime import datetime
from pathlib import Path

from tqdm import tqdm

from memgym.data_synth.capabilities import capability_for, secondary_for
from memgym.data_synth.errors import DataFormatError, QuirkLog, get_field
from memgym.data_synth.paths import data_root, read_json, require
from memgym.memory_bank.schema import Conversation, QAItem, Session, Turn
from memgym.llm.errors import ConfigError

BEAM_SIZES: tuple[str, ...] = ("100K", "1M")
BEAM_SPEAKERS = ("user", "assistant")
BEAM_DATE_FORMAT = "%B-%d-%Y"
CHAT_FILE = "chat.json"
TRUNCATED_FILE = "chat_trunecated.json"  # sic, the repository's spelling
QUESTIONS_FILE = Path("probing_questions") / "probing_questions.json"

#: Ability -> the field holding its reference answer (``beam/README.md`` table).
BEAM_ANSWER_FIELD: dict[str, str] = {
    "abstention": "ideal_response",
    "contradiction_resolution": "ideal_answer",
    "event_ordering": "answer",
    "information_extraction": "answer",
    "instruction_following": "expected_compliance",
    "knowledge_update": "answer",
    "multi_session_reasoning": "answer",
    "preference_following": "expected_compliance",
    "summarization": "ideal_summary",
    "temporal_reasoning": "answer",
}
#: The 10 abilities in the file's order.
BEAM_ABILITIES: tuple[str, ...] = tuple(BEAM_ANSWER_FIELD)
KNOWN_DIFFICULTIES = ("easy", "medium", "hard")

# " ->-> 3,12", " ->-> 3,N/A", " ->-> 3,", " ->-> 3,12, 14"
_MARKER = re.compile(r"[ \t]*->->\s*\d+\s*,\s*(?:N/A|\d+(?:\s*,\s*\d+)*)?")


def beam_root() -> Path:
    """``<data root>/beam`` (not checked for existence)."""
    return data_root() / "beam"


def strip_plan_markers(text: str) -> str:
    """Remove the ``->-> b,k`` plan markers (``"Hi? ->-> 1,2"`` -> ``"Hi?"``; mid-text: one space)."""
    if "->->" not in text:
        return text

    def repl(m: re.Match) -> str:
        end = m.end()
        return " " if end < len(text) and not text[end].isspace() else ""

    return _MARKER.sub(repl, text).rstrip()


def chat_id_of(folder: Path) -> str:
    """``"<size>-<n>"`` from a chat folder ``.../<size>/<n>``."""
    folder = Path(folder)
    return f"{folder.parent.name}-{folder.name}"


def flatten_ids(value, file: Path, record: str, field: str) -> list[int]:
    """Every int in ``value`` (int, nested lists or dicts), in order; DataFormatError otherwise."""
    if isinstance(value, bool) or not isinstance(value, (int, list, dict)):
        raise DataFormatError(file, record, field, f"expected message ids (int, list or dict), got "
                                                   f"{type(value).__name__} {str(value)[:40]!r}")
    if isinstance(value, int):
        return [value]
    items = value.items() if isinstance(value, dict) else enumerate(value)
    out: list[int] = []
    for k, v in items:
        out += flatten_ids(v, file, record, f"{field}[{k!r}]" if isinstance(k, str) else f"{field}[{k}]")
    return out


def parse_beam_date(text: str | None) -> datetime | None:
    """``"March-15-2024"`` -> ``datetime(2024, 3, 15)``; ``None`` if absent or unparsable."""
    if not isinstance(text, str):
        return None
    try:
        return datetime.strptime(text.strip(), BEAM_DATE_FORMAT)
    except ValueError:
        return None


def _parse_chat(file: Path, data, strip_markers: bool, quirks: QuirkLog, cid: str) -> tuple[Session, ...]:
    if not isinstance(data, list):
        raise DataFormatError(file, "-", "-", f"expected a JSON list of batches, got {type(data).__name__}")
    if not data:
        raise DataFormatError(file, "-", "-", "the chat holds no batches (an empty list): nothing to remember")
    sessions: list[Session] = []
    seen: set[int] = set()
    last_date = None
    for bi, batch in enumerate(data):
        rec = f"batch #{bi}"
        turns_raw = get_field(batch, "turns", list, file, rec, "turns")
        bnum = batch.get("batch_number", bi + 1)
        rec = f"batch {bnum}"
        turns: list[Turn] = []
        anchor = None
        for ti, turn in enumerate(turns_raw):
            if not isinstance(turn, list):
                raise DataFormatError(file, rec, f"turns[{ti}]", f"expected a list of messages, got "
                                                                 f"{type(turn).__name__}")
            for mi, msg in enumerate(turn):
                fp = f"turns[{ti}][{mi}]"
                mid = get_field(msg, "id", int, file, rec, f"{fp}.id")
                mrec = f"message {mid}"
                role = get_field(msg, "role", str, file, mrec, "role")
                if role not in BEAM_SPEAKERS:
                    raise DataFormatError(file, mrec, "role", f"expected user or assistant, got {role!r}")
                content = get_field(msg, "content", str, file, mrec, "content")
                if mid in seen:
                    raise DataFormatError(file, mrec, "id", "duplicate message id")
                seen.add(mid)
                if role == "user" and anchor is None and not turns:
                    anchor = msg.get("time_anchor")
                if strip_markers:
                    content = strip_plan_markers(content)
                turns.append(Turn(id=str(mid), speaker=role, text=content))
        date = parse_beam_date(anchor)
        if date is None:
            quirks.add("sessions without a parsable date", f"{cid} {rec}: {anchor!r}")
        elif last_date is not None and date < last_date:
            quirks.add("session dates that go backwards", f"{cid} {rec}")
        last_date = date or last_date
        sessions.append(Session(index=bi + 1, id=f"batch-{bnum}", date=date,
                                date_text=anchor if isinstance(anchor, str) else "", turns=tuple(turns)))
    return tuple(sessions)


def _parse_questions(file: Path, data, cid: str, sessions: tuple[Session, ...],
                     quirks: QuirkLog) -> tuple[QAItem, ...]:
    if not isinstance(data, dict):
        raise DataFormatError(file, "-", "-", f"expected a JSON object of abilities, got {type(data).__name__}")
    if not data or not any(isinstance(qs, list) and qs for qs in data.values()):
        raise DataFormatError(file, "-", "-", "no probing questions (an empty object or only empty lists): nothing "
                                              "to score")
    session_of = {t.id: s.index for s in sessions for t in s.turns}
    out: list[QAItem] = []
    for ability, qs in data.items():
        if ability not in BEAM_ANSWER_FIELD:
            raise DataFormatError(file, ability, "-", f"unknown ability; expected one of {', '.join(BEAM_ABILITIES)}")
        if not isinstance(qs, list):
            raise DataFormatError(file, ability, "-", f"expected a list of questions, got {type(qs).__name__}")
        for k, q in enumerate(qs):
            rec = f"{ability}[{k}]"
            question = get_field(q, "question", str, file, rec, "question")
            answer = get_field(q, BEAM_ANSWER_FIELD[ability], str, file, rec, BEAM_ANSWER_FIELD[ability])
            rubric = get_field(q, "rubric", list, file, rec, "rubric", optional=True)
            if rubric is None:
                quirks.add("questions without a rubric", f"{cid} {rec}")
                rubric = []
            for j, item in enumerate(rubric):
                if not isinstance(item, str):
                    raise DataFormatError(file, rec, f"rubric[{j}]", f"expected str, got {type(item).__name__}")
            diff = q.get("difficulty")
            if diff not in KNOWN_DIFFICULTIES:
                quirks.add("odd difficulty spellings kept as is", f"{cid} {rec}: {diff!r}")
            src = q.get("source_chat_ids")
            if src is None:
                if ability != "abstention":
                    quirks.add("questions without source_chat_ids (no evidence)", f"{cid} {rec}")
                ids: list[int] = []
            else:
                ids = flatten_ids(src, file, rec, "source_chat_ids")
            evidence = []
            for e in dict.fromkeys(ids):
                if str(e) in session_of:
                    evidence.append(str(e))
                else:
                    quirks.add("evidence ids not in the loaded chat dropped", f"{cid} {rec}: {e}")
            qid = f"{cid}:{ability}:{k + 1}"
            n_sess = len({session_of[e] for e in evidence})
            out.append(QAItem(id=qid, question=question, answer=answer, evidence=tuple(evidence), category=ability,
                              capability=capability_for("beam", ability, qid),
                              secondary=secondary_for("beam", ability, qid, n_sess),
                              rubric=tuple(rubric)))
    return tuple(out)


def load_beam_chat(folder: Path | str, *, truncated: bool = True, strip_markers: bool = True,
                   quirks: QuirkLog | None = None) -> Conversation:
    """Load one BEAM chat folder ``.../beam/<size>/<n>`` as a :class:`Conversation`.
    ``truncated=False`` reads ``chat.json``; ``quirks``: a shared log (None: warn for this chat).
    Raises DataFileNotFoundError for absent files, DataFormatError for a broken record."""
    folder = Path(folder)
    cid = chat_id_of(folder)
    own = quirks is None
    quirks = quirks if quirks is not None else QuirkLog(f"BEAM {cid}")
    chat_file = folder / TRUNCATED_FILE
    if not (truncated and chat_file.is_file()):
        chat_file = folder / CHAT_FILE
    sessions = _parse_chat(chat_file, read_json(chat_file, "BEAM chat file"), strip_markers, quirks, cid)
    qfile = folder / QUESTIONS_FILE
    questions = _parse_questions(qfile, read_json(qfile, "BEAM probing questions"), cid, sessions, quirks)
    if own:
        quirks.emit(stacklevel=3)
    return Conversation(id=cid, speakers=BEAM_SPEAKERS, sessions=sessions, questions=questions)


def _chat_key(folder: Path):
    size = BEAM_SIZES.index(folder.parent.name) if folder.parent.name in BEAM_SIZES else len(BEAM_SIZES)
    return (size, int(folder.name) if folder.name.isdigit() else 10**9, folder.name)


def find_chats(path: Path | str | None = None) -> list[Path]:
    """Chat folders under ``path`` (a chat, size or root folder; default :func:`beam_root`), by
    size then number. DataFileNotFoundError for a missing path, DataFormatError when none found."""
    p = require(Path(path) if path is not None else beam_root(), "BEAM data folder")
    if (p / CHAT_FILE).is_file():
        return [p]
    found = [c.parent for c in p.glob(f"*/{CHAT_FILE}")] + [c.parent for c in p.glob(f"*/*/{CHAT_FILE}")]
    if not found:
        raise DataFormatError(p, "-", "-", "no BEAM chat folder (<size>/<n>/chat.json) found here")
    return sorted(set(found), key=_chat_key)


def load_beam(path: Path | str | None = None, ids: list[str] | None = None, *, truncated: bool = True,
              strip_markers: bool = True, progress: bool = False) -> list[Conversation]:
    """BEAM chats under ``path`` (:func:`find_chats`), 100K first, then 1M, in numeric order;
    ``ids`` keeps only those (unselected folders are not read; ValueError lists missing ids)."""
    folders = find_chats(path)
    by_id = {chat_id_of(f): f for f in folders}
    if ids is not None:
        missing = [i for i in dict.fromkeys(ids) if i not in by_id]
        if missing:
            raise ConfigError(f"BEAM chat ids not found under {path or beam_root()}: {', '.join(missing)} "
                             f"(known: {', '.join(by_id)})")
        folders = [by_id[i] for i in dict.fromkeys(ids)]
    quirks = QuirkLog("BEAM")
    out = [load_beam_chat(f, truncated=truncated, strip_markers=strip_markers, quirks=quirks)
           for f in tqdm(folders, desc="BEAM", disable=not progress, unit="chat")]
    quirks.emit(stacklevel=3)
    return out
