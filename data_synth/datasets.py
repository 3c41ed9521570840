"""The one dispatch from a dataset name, ids and split to its loader (:func:`load_conversations`),
the session-restricted view of a conversation (:func:`restrict`) and the counts ``memgym data
stats`` prints (:func:`dataset_stats`)."""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from memgym.data_synth.capabilities import count_by_capability, is_abstention_id
from memgym.memory_bank.schema import Conversation
from memgym.llm.errors import ConfigError

#: Datasets with a loader, in the order ``--help`` lists them.
DATASETS: tuple[str, ...] = ("locomo", "longmemeval", "beam")


def load_conversations(dataset: str, path: Path | str | None = None, *, ids: Sequence[str] | None = None,
                       split: str | None = None, splits_path: Path | str | None = None,
                       n_sessions: int | None = None, max_questions: int | None = None,
                       beam_truncated: bool = True, beam_strip_markers: bool = True) -> list[Conversation]:
    """The conversations of ``dataset`` in file order (BEAM: 100K, then 1M, by number).

        Args:
            path: the data file (BEAM: a chat, size or root folder); default under ``$MEMGYM_DATA``.
            ids: keep only these ids (deduplicated); with ``split`` an id must be in both.
            split: one of :func:`memgym.data_synth.splits.split_names` (LongMemEval: from ``splits_path``).
            n_sessions: first N sessions and the QA they answer (:func:`restrict`).
            max_questions: first N questions per conversation.
            beam_truncated, beam_strip_markers: see :func:`memgym.data_synth.beam.load_beam`.

        Raises ValueError (unknown dataset/split, an id absent or outside ``split``, bad counts) and
        the loaders' DataFileNotFoundError / DataFormatError.
        """
    if dataset not in DATASETS:
        raise ConfigError(f"unknown dataset {dataset!r}; expected one of {', '.join(DATASETS)}")
    if max_questions is not None and max_questions < 0:
        raise ValueError(f"max_questions must be >= 0, got {max_questions}")
    wanted = None if ids is None else list(dict.fromkeys(ids))
    if split is not None:
        from memgym.data_synth.splits import split_ids

        in_split = list(split_ids(dataset, split, splits_path))
        if dataset == "beam" and path is not None:  # a chat or size folder holds part of the split
            from memgym.data_synth.beam import chat_id_of, find_chats

            found = {chat_id_of(f) for f in find_chats(path)}
            in_split = [i for i in in_split if i in found]
        if wanted is None:
            wanted = in_split
        else:
            outside = [i for i in wanted if i not in set(in_split)]
            if outside:
                raise ConfigError(f"{dataset} ids not in split {split!r}: {', '.join(outside)}")
    if dataset == "locomo":
        from memgym.data_synth.locomo import load_locomo

        convs = load_locomo(path, ids=wanted)
    elif dataset == "beam":
        from memgym.data_synth.beam import load_beam

        convs = load_beam(path, ids=wanted, truncated=beam_truncated, strip_markers=beam_strip_markers)
    else:
        from memgym.data_synth.longmemeval import load_longmemeval

        convs = load_longmemeval(path, question_ids=wanted)
    if n_sessions is not None:
        convs = [restrict(c, n_sessions) for c in convs]
    if max_questions is not None:
        convs = [replace(c, questions=c.questions[:max_questions]) for c in convs]
    return convs


def restrict(conv: Conversation, n_sessions: int) -> Conversation:
    """The first ``n_sessions`` sessions and the questions whose evidence (non-empty) lies wholly in
        them, ids and order kept. ValueError unless ``n_sessions`` is an int >= 1.
        """
    if isinstance(n_sessions, bool) or not isinstance(n_sessions, int) or n_sessions < 1:
        raise ValueError(f"n_sessions must be an int >= 1, got {n_sessions!r}")
    sessions = conv.sessions[:n_sessions]
    kept_turns = {t.id for s in sessions for t in s.turns}
    questions = tuple(q for q in conv.questions
                      if q.evidence and all(e in kept_turns for e in q.evidence))
    return replace(conv, sessions=sessions, questions=questions)


STATS_DATASETS: tuple[str, ...] = DATASETS


def _category_key(cat: str):
    return (0, int(cat), "") if cat.isdigit() else (1, 0, cat)


def dataset_stats(convs: Sequence[Conversation], dataset: str, with_ids: bool = False) -> dict:
    """JSON-ready counts of ``convs``: ``conversations``, ``sessions``, ``turns``, ``questions``,
        ``by_category`` (numeric labels first), ``by_capability``; longmemeval ``abstention``; beam
        ``rubric_items`` and ``chats``; ``with_ids``: every question id in load order.
        ValueError for a dataset outside :data:`STATS_DATASETS`.
        """
    if dataset not in STATS_DATASETS:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {', '.join(STATS_DATASETS)}")
    questions = [q for c in convs for q in c.questions]
    cats = Counter(q.category for q in questions)
    out = {
        "conversations": len(convs),
        "sessions": sum(len(c.sessions) for c in convs),
        "turns": sum(c.n_turns() for c in convs),
        "questions": len(questions),
        "by_category": {k: cats[k] for k in sorted(cats, key=_category_key)},
        "by_capability": count_by_capability(questions),
    }
    if dataset == "longmemeval":
        out["abstention"] = sum(1 for q in questions if is_abstention_id(q.id))
    if dataset == "beam":
        out["rubric_items"] = sum(len(q.rubric) for q in questions)
        out["chats"] = {c.id: {"sessions": len(c.sessions), "turns": c.n_turns(), "questions": len(c.questions)}
                        for c in convs}
    if with_ids:
        out["ids"] = [q.id for q in questions]
    return out


def conversations_by_id(dataset: str, ids: Sequence[str], path: Path | str | None = None) -> dict[str, Conversation]:
    """``{id: Conversation}`` of :func:`load_conversations` for ``ids`` (same errors)."""
    return {c.id: c for c in load_conversations(dataset, path, ids=ids)}


#: The LoCoMo ids the ``memgym eval`` / ``program eval`` recipes default to (so a recipe that
#: sets ``split`` or ``dataset: beam`` without ``conversations`` can be told from one that sets both).
DEFAULT_SELECTIONS: tuple[tuple[str, ...], ...] = (("conv-30",), ("conv-26", "conv-30"))


def check_selection(dataset: str, path, conversations, split: str | None, scorer: str) -> None:
    """Parse-time checks of a recipe's data selection (``memgym eval`` / ``program eval``):
        ``rubric-recall`` only on BEAM; ``split`` a known name, not with explicit ``conversations``,
        non-empty on a BEAM folder; else every BEAM id found under ``path``. On BEAM the LoCoMo default
        ids (:data:`DEFAULT_SELECTIONS`) are replaced IN PLACE by every chat under ``path``.
        Raises :class:`memgym.llm.errors.ConfigError` naming the flag."""
    if scorer == "rubric-recall" and dataset != "beam":
        raise ConfigError("--scorer rubric-recall needs --dataset beam (it scores BEAM rubrics)")
    given = tuple(conversations or ())
    defaulted = given in DEFAULT_SELECTIONS
    if split is not None:
        from memgym.data_synth.splits import split_ids, split_names
        if split not in split_names(dataset):
            raise ConfigError(f"--split: {split!r} is not a {dataset} split; expected one of "
                              f"{', '.join(split_names(dataset))}")
        if given and not defaulted:
            raise ConfigError(f"--split {split} and --conversations {' '.join(given)} both given: the split runs its "
                              "own ids and would ignore the conversations; give one of them")
        if dataset == "beam" and path is not None:
            from memgym.data_synth.beam import chat_id_of, find_chats
            found = {chat_id_of(f) for f in find_chats(path)}
            if not [i for i in split_ids(dataset, split) if i in found]:
                raise ConfigError(f"--split {split}: none of its BEAM chats is under {path} (found there: "
                                  f"{', '.join(sorted(found))}); nothing would be evaluated")
        return
    if not given:
        raise ConfigError("--conversations is empty: nothing would be evaluated")
    if dataset == "beam":
        from memgym.data_synth.beam import chat_id_of, find_chats
        known = [chat_id_of(f) for f in find_chats(path)]
        if defaulted and isinstance(conversations, list):
            conversations[:] = known  # the folder's chats are the default
            return
        missing = [c for c in conversations if c not in known]
        if missing:
            raise ConfigError(f"--conversations: BEAM chat ids {', '.join(missing)} not found under "
                              f"{path or 'the BEAM root'}; known: {', '.join(known)}")
