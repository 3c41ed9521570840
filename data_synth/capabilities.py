"""Native benchmark labels -> PrisMem capabilities (F, T, P, M, A): the tables below are
``docs/design.md`` § "Data model"'s (a LongMemEval id ending in ``_abs`` is A whatever its type).
Secondary capabilities (memgym's rule, for the scheduler's "pressure" term): an abstention item
keeps its type's capability; evidence spanning >= 2 sessions adds M unless M is primary.
"""
from __future__ import annotations

import re
from collections.abc import Iterable

from memgym.memory_bank.schema import Capability, QAItem

F, T, P, M, A = (Capability.FACTUAL, Capability.TEMPORAL, Capability.PREFERENCE,
                 Capability.MULTI_SESSION, Capability.ADVERSARIAL)

#: Capabilities in display order; stats and tables use these letters as keys.
CAPABILITY_ORDER: tuple[Capability, ...] = (F, T, P, M, A)

LOCOMO_CATEGORY_NAMES: dict[str, str] = {
    "1": "multi-hop", "2": "temporal", "3": "open-domain", "4": "single-hop", "5": "adversarial",
}
LOCOMO_MAP: dict[str, Capability] = {"4": F, "2": T, "1": M, "3": P, "5": A}

LONGMEMEVAL_MAP: dict[str, Capability] = {
    "single-session-user": F,
    "single-session-assistant": F,
    "temporal-reasoning": T,
    "single-session-preference": P,
    "multi-session": M,
    "knowledge-update": T,
}
LONGMEMEVAL_ABSTENTION_SUFFIX = "_abs"

BEAM_MAP: dict[str, Capability] = {
    "information_extraction": F,
    "temporal_reasoning": T,
    "event_ordering": T,
    "knowledge_update": T,
    "preference_following": P,
    "instruction_following": P,
    "multi_session_reasoning": M,
    "summarization": M,
    "abstention": A,
    "contradiction_resolution": A,
}

DATASETS: tuple[str, ...] = ("locomo", "longmemeval", "beam")


def _norm_beam(category: str) -> str:
    return re.sub(r"[\s\-]+", "_", category.strip().lower())


def is_abstention_id(qid: str | None) -> bool:
    """True when a LongMemEval question id ends in ``_abs`` (the 30 abstention questions)."""
    return bool(qid) and str(qid).endswith(LONGMEMEVAL_ABSTENTION_SUFFIX)


def native_capability(dataset: str, category: str | int) -> Capability:
    """The capability of ``dataset``'s label ``category`` (LoCoMo 1..5, a LongMemEval
    ``question_type``, a BEAM ability in any case/separator), ignoring abstention ids.
    ValueError (listing the known labels) for an unknown dataset or label."""
    ds = str(dataset).strip().lower()
    if ds == "locomo":
        key, table = str(category).strip(), LOCOMO_MAP
    elif ds == "longmemeval":
        key, table = str(category).strip(), LONGMEMEVAL_MAP
    elif ds == "beam":
        key, table = _norm_beam(str(category)), BEAM_MAP
    else:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(DATASETS)}")
    try:
        return table[key]
    except KeyError:
        raise ValueError(
            f"unknown {ds} category {category!r}; expected one of {', '.join(sorted(table))}"
        ) from None


def capability_for(dataset: str, category: str | int, qid: str | None = None) -> Capability:
    """Primary capability of a question (LongMemEval ``_abs`` ids: A); ValueError as :func:`native_capability`."""
    cap = native_capability(dataset, category)
    if str(dataset).strip().lower() == "longmemeval" and is_abstention_id(qid):
        return A
    return cap


def secondary_for(
    dataset: str, category: str | int, qid: str | None = None, n_evidence_sessions: int = 0
) -> tuple[Capability, ...]:
    """Secondary capabilities (module rule) in ``CAPABILITY_ORDER``, never the primary;
    ``n_evidence_sessions``: distinct sessions of the evidence. ValueError for bad input."""
    if n_evidence_sessions < 0:
        raise ValueError(f"n_evidence_sessions must be >= 0, got {n_evidence_sessions}")
    primary = capability_for(dataset, category, qid)
    out: set[Capability] = set()
    native = native_capability(dataset, category)
    if primary is A and native is not A:
        out.add(native)
    if n_evidence_sessions >= 2:
        out.add(M)
    out.discard(primary)
    return tuple(c for c in CAPABILITY_ORDER if c in out)


def by_capability(questions: Iterable[QAItem]) -> dict[Capability, list[QAItem]]:
    """Questions by primary capability: all five keys in ``CAPABILITY_ORDER``, input order kept."""
    out: dict[Capability, list[QAItem]] = {c: [] for c in CAPABILITY_ORDER}
    for q in questions:
        if q.capability is not None:
            out[Capability(q.capability)].append(q)
    return out


def count_by_capability(questions: Iterable[QAItem]) -> dict[str, int]:
    """``{"F": n, "T": n, "P": n, "M": n, "A": n}`` (zeros kept)."""
    return {c.value: len(v) for c, v in by_capability(questions).items()}
