"""ADRPO's reward rows, train and evaluation alike: one :class:`memgym.rewards.samples.RewardSample`
per (conversation, session or session segment, manager) of expert trajectories, then the recipe's
selection (:func:`memgym.training.adrpo_data.select_samples`).

A whole-session row (MemBuilder arXiv 2601.05488 §3.4; docs/design.md § "Dense session reward and
ADRPO") has the inference prompt over the expert bank after session t-1, the expert's outputs for
session t and session t's QA (the trajectory line's ``qa``, or ``qa_path``). A segment row
(``segment_tokens``; the cut of segmented SFT, :func:`memgym.training.sft_segments.segment_steps`)
has the segment's prompt over the bank before it, the expert's share for the segment, and the
session's questions whose evidence completes within the segment (no evidence: the last segment).
Sessions or segments without QA are skipped (one warning). Keys:
:func:`memgym.rewards.samples.sample_key`.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

from memgym.data_synth.qa_format import load_session_qa, qa_item_from_json
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.prompts import build_prompt
from memgym.rewards.samples import RewardSample, sample_key
from memgym.training.adrpo_data import select_samples
from memgym.training.sft_data import check_managers, expert_session_states
from memgym.training.sft_segments import segment_steps


def question_segments(evidence: Sequence[Sequence[str]], segment_turns: Sequence[Sequence[str]]) -> list[int]:
    """For each question's evidence turn ids, the 0-based index of the segment that completes
    it (the latest segment holding one of its turns; the last segment when none of its turns is
    in the session). Raises ValueError for no segments."""
    if not segment_turns:
        raise ValueError("no segments")
    where = {t: k for k, ids in enumerate(segment_turns) for t in ids}
    last = len(segment_turns) - 1
    return [max((where[t] for t in ev if t in where), default=last) for ev in evidence]


def trajectory_paths(names: Sequence[str | Path]) -> list[Path]:
    """Each name as a path, or looked up as ``$MEMGYM_DATA/expert/<name>.jsonl``
    (:func:`memgym.data_synth.extractors.resolve_expert_path`; FileNotFoundError naming both)."""
    from memgym.data_synth.extractors import resolve_expert_path

    return [resolve_expert_path(str(n)) for n in names]


def _units(states, *, tokenizer, segment_tokens, embedder):
    """``(state, segment, bank_before, {manager: messages}, {manager: expert output}, segment's turn ids)``
    per session (segment 0) or per session segment, in file order."""
    if segment_tokens is None:
        for st in states:
            yield (st, 0, st.bank_before, {m: build_prompt(m, st.bank_before, st.session, embedder).messages
                                           for m in MANAGERS},
                   {m: st.step.output_text(m) for m in MANAGERS}, None)
        return
    if segment_tokens < 1:
        raise ValueError(f"segment_tokens must be >= 1, got {segment_tokens}")
    for step in segment_steps(states, tokenizer=tokenizer, segment_tokens=segment_tokens, embedder=embedder):
        yield (step.state, step.segment, step.bank_before, {m: p.messages for m, p in step.prompts.items()},
               dict(step.outputs), [t.id for t in step.session.turns])


def build_rows(trajectories: Sequence[str | Path], *, tokenizer=None, embedder=None,
               managers: Sequence[str] = MANAGERS, segment_tokens: int | None = None, dataset: str = "locomo",
               data_path=None, qa_path=None) -> list[RewardSample]:
    """Every candidate row of ``trajectories`` (files, or names in ``$MEMGYM_DATA/expert``), in file,
    session, segment and manager order (module doc). ``tokenizer`` cuts segments (needed with
    ``segment_tokens``); ``embedder`` ranks the entries each prompt shows (None: most recent).
    Raises ValueError (bad managers, ``segment_tokens`` < 1, ``qa_path`` with segments, a ``qa_path``
    matching no session), FileNotFoundError, the trajectory errors, SegmentError."""
    ms = check_managers(managers)
    if segment_tokens is not None and qa_path is not None:
        raise ValueError(f"segment rows take their QA from the trajectories' own qa; got qa_path {qa_path!r}")
    qa_file = load_session_qa(qa_path) if qa_path is not None else None
    states = expert_session_states(trajectory_paths(trajectories), dataset=dataset, data_path=data_path)
    qa_of = {}
    for st in states:
        key = (st.conversation_id, st.session.index)
        qa_of[key] = (qa_file.get(key, []) if qa_file is not None else
                      [qa_item_from_json(q, *key, j, st.step.date, st.trajectory_file, st.step.line)
                       for j, q in enumerate(st.step.qa)])
    units = list(_units(states, tokenizer=tokenizer, segment_tokens=segment_tokens, embedder=embedder))
    placed = {}
    if segment_tokens is not None:
        turns: dict[tuple[str, int], list[list[str]]] = {}
        for st, _, _, _, _, ids in units:
            turns.setdefault((st.conversation_id, st.session.index), []).append(ids)
        placed = {key: question_segments([q.evidence for q in qa_of[key]], segs) for key, segs in turns.items()}
    samples: list[RewardSample] = []
    skipped = []
    for st, segment, bank, messages, outputs, _ in units:
        conv, sess = st.conversation_id, st.session.index
        qa = list(qa_of[(conv, sess)])
        if segment:
            qa = [q for q, k in zip(qa, placed[(conv, sess)]) if k == segment - 1]
        if not qa:
            skipped.append(f"{conv}/s{sess}" + (f".{segment}" if segment else ""))
            continue
        samples += [RewardSample(key=sample_key(conv, sess, m, segment), conversation_id=conv, session=sess,
                                 manager=m, messages=messages[m], expert_outputs=outputs, bank_before=bank,
                                 qa=list(qa), segment=segment) for m in ms]
    unit = "segment(s)" if segment_tokens is not None else "session(s)"
    if qa_file is not None and not samples and skipped:
        raise ValueError(f"QA file {qa_path}: no QA for any of the {len(skipped)} trajectory session(s) "
                         f"(read {len(qa_file)} session(s) from it; e.g. {', '.join(skipped[:3])} are missing): "
                         "is it a `memgym synth qa` output for these conversations?")
    if skipped:
        warnings.warn(f"reward rows: {len(skipped)} {unit} without QA skipped (e.g. {', '.join(skipped[:3])})",
                      stacklevel=2)
    return samples


def reward_rows(trajectories: Sequence[str | Path], *, tokenizer, embedder, managers: Sequence[str] = MANAGERS,
                segment_tokens: int | None = None, dataset: str = "locomo", data_path=None, qa_path=None,
                sessions: Sequence[int] | None = None, max_prompt_tokens: int | None = None,
                keys: Sequence[str] | None = None, whole_sessions: bool = False,
                first: int | None = None) -> list[RewardSample]:
    """:func:`build_rows`, then :func:`memgym.training.adrpo_data.select_samples` (``keys``,
    ``sessions``, ``max_prompt_tokens`` in the policy ``tokenizer``'s tokens, ``whole_sessions``),
    then the first ``first`` rows (None: all): ADRPO's training rows and the validation rows of
    the in-trainer measurement. Raises what those raise."""
    rows = build_rows(trajectories, tokenizer=tokenizer, embedder=embedder, managers=managers,
                      segment_tokens=segment_tokens, dataset=dataset, data_path=data_path, qa_path=qa_path)
    rows = select_samples(rows, sessions=sessions, max_prompt_tokens=max_prompt_tokens, tokenizer=tokenizer,
                          whole_sessions=whole_sessions, keys=keys)
    return rows[:first] if first else rows
