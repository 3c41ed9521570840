"""The session-QA line format shared by ``memgym synth qa``, expert trajectories and the session
reward (``docs/design.md`` § "Dense session reward and ADRPO"). JSONL, one line per session::

    {"conversation_id": str, "session": int (1-based), "date": str,
     "qa": [{"question": str, "answer": str, "evidence": [turn id, ...], "kind": str}, ...], ...}
"""
from __future__ import annotations

from pathlib import Path

from memgym.data_synth.jsonl import read_jsonl
from memgym.llm.errors import MemgymError
from memgym.memory_bank.schema import Capability, QAItem

#: Synthetic question kinds and the capability each tests.
KINDS: tuple[str, ...] = ("single-session", "multi-session", "temporal")
KIND_CAPABILITY = {"single-session": Capability.FACTUAL, "multi-session": Capability.MULTI_SESSION,
                   "temporal": Capability.TEMPORAL}


class SessionQAError(MemgymError, ValueError):
    """A session-QA line or item is malformed; the message names the file, line and field."""

    kind = "data"

    def __init__(self, file, line: int, field: str, reason: str):
        super().__init__(f"{file}: line {line}, field '{field}': {reason}")
        self.file, self.line, self.field, self.reason = str(file), line, field, reason


def qa_item_from_json(obj: dict, conversation_id: str, session: int, j: int, date: str | None = None,
                      file="<memory>", line: int = 0) -> QAItem:
    """One ``{question, answer, evidence, kind}`` object as a :class:`QAItem` with id
        ``<conv>/s<session>/q<j>``: ``kind`` -> category, capability by :data:`KIND_CAPABILITY` (or
        the item's own), ``question_date`` = ``date``. :class:`SessionQAError` names a bad field.
        """
    where = f"qa[{j}]"
    if not isinstance(obj, dict):
        raise SessionQAError(file, line, where, f"expected an object, got {type(obj).__name__}")
    q = obj.get("question")
    if not isinstance(q, str) or not q.strip():
        raise SessionQAError(file, line, f"{where}.question", f"expected a non-empty str, got {q!r:.60}")
    a = obj.get("answer")
    if isinstance(a, int) and not isinstance(a, bool):
        a = str(a)
    if not isinstance(a, str):
        raise SessionQAError(file, line, f"{where}.answer", f"expected a str, got {type(a).__name__}")
    ev = obj.get("evidence", [])
    if not isinstance(ev, list) or not all(isinstance(e, str) for e in ev):
        raise SessionQAError(file, line, f"{where}.evidence", "expected a list of turn-id strings")
    kind = str(obj.get("kind", obj.get("category", "")))
    cap = KIND_CAPABILITY.get(kind)
    if cap is None and obj.get("capability"):
        try:
            cap = Capability(obj["capability"])
        except ValueError:
            raise SessionQAError(file, line, f"{where}.capability", f"unknown capability {obj['capability']!r}") from None
    return QAItem(id=str(obj.get("id") or f"{conversation_id}/s{session}/q{j}"), question=q, answer=a,
                  evidence=tuple(ev), category=kind, capability=cap, question_date=date or None)


def load_session_qa(path) -> dict[tuple[str, int], list[QAItem]]:
    """``{(conversation_id, session): [QAItem, ...]}`` of a session-QA file (a torn last line is
        skipped). :class:`SessionQAError` for a broken line or a repeated session; FileNotFoundError.
        """
    path = Path(path)
    out: dict[tuple[str, int], list[QAItem]] = {}
    for i, obj in read_jsonl(path, SessionQAError, what="session-QA file", allow_torn_tail=True):
        if not isinstance(obj, dict):
            raise SessionQAError(path, i, "<root>", f"expected an object, got {type(obj).__name__}")
        conv, sess = obj.get("conversation_id"), obj.get("session")
        if not isinstance(conv, str) or isinstance(sess, bool) or not isinstance(sess, int) or sess < 1:
            raise SessionQAError(path, i, "conversation_id/session", f"expected str and int >= 1, got {conv!r}, {sess!r}")
        qa = obj.get("qa")
        if not isinstance(qa, list):
            raise SessionQAError(path, i, "qa", "expected a list")
        if (conv, sess) in out:
            raise SessionQAError(path, i, "session", f"{conv} session {sess} appears twice")
        out[(conv, sess)] = [qa_item_from_json(q, conv, sess, j, obj.get("date"), path, i) for j, q in enumerate(qa)]
    return out
