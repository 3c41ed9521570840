"""ADRPO reward rows on session segments, the rollout unit of segmented SFT: one row per
(conversation, session, segment, manager) from :func:`memgym.training.sft_segments.segment_steps`.

The prompt is the segment's inference prompt over the bank before it; the expert outputs are
the expert's share for the segment; the QA are the session's questions whose evidence
completes within the segment (no evidence: the last segment); segments without QA are
skipped. Keys: ``"<conversation_id>/s<session>.<segment>/<manager>"``.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

from memgym.data_synth.qa_format import qa_item_from_json
from memgym.memory_bank.actions import MANAGERS
from memgym.rewards.samples import RewardSample
from memgym.training.sft_data import check_managers, expert_session_states
from memgym.training.sft_segments import SegmentStats, segment_steps


def segment_key(conversation_id: str, session: int, segment: int, manager: str) -> str:
    """``"<conversation_id>/s<session>.<segment>/<manager>"``."""
    return f"{conversation_id}/s{session}.{segment}/{manager}"


def question_segments(evidence: Sequence[Sequence[str]], segment_turns: Sequence[Sequence[str]]) -> list[int]:
    """For each question's evidence turn ids, the 0-based index of the segment that completes
    it (the latest segment holding one of its turns; the last segment when none of its turns is
    in the session). Raises ValueError for no segments."""
    if not segment_turns:
        raise ValueError("no segments")
    where = {t: k for k, ids in enumerate(segment_turns) for t in ids}
    last = len(segment_turns) - 1
    return [max((where[t] for t in ev if t in where), default=last) for ev in evidence]


def segment_reward_samples(trajectory_paths: Sequence[str | Path], *, tokenizer, segment_tokens: int,
                           embedder=None, managers: Sequence[str] = MANAGERS, dataset: str = "locomo",
                           data_path=None, stats: SegmentStats | None = None) -> list[RewardSample]:
    """One :class:`memgym.rewards.samples.RewardSample` per (session, segment with QA, manager), in file
    and segment order. Raises ValueError (unknown manager, ``segment_tokens`` < 1), the
    trajectory errors, SegmentError or SessionQAError.
    """
    ms = check_managers(managers)
    if segment_tokens < 1:
        raise ValueError(f"segment_tokens must be >= 1, got {segment_tokens}")
    states = expert_session_states(trajectory_paths, dataset=dataset, data_path=data_path)
    qa_of: dict[tuple[str, int], list[list]] = {}
    for st in states:
        st_qa = [qa_item_from_json(q, st.conversation_id, st.session.index, j, st.step.date, st.trajectory_file,
                                   st.step.line) for j, q in enumerate(st.step.qa)]
        qa_of[(st.conversation_id, st.session.index)] = st_qa
    steps = list(segment_steps(states, tokenizer=tokenizer, segment_tokens=segment_tokens, embedder=embedder,
                               stats=stats))
    turns: dict[tuple[str, int], list[list[str]]] = {}
    for step in steps:
        turns.setdefault((step.state.conversation_id, step.session.index), []).append([t.id for t in step.session.turns])
    placed: dict[tuple[str, int], list[int]] = {
        key: question_segments([q.evidence for q in qa_of[key]], segs) for key, segs in turns.items()}
    samples: list[RewardSample] = []
    skipped = []
    for step in steps:
        conv, sess = step.state.conversation_id, step.session.index
        qa = [q for q, k in zip(qa_of[(conv, sess)], placed[(conv, sess)]) if k == step.segment - 1]
        if not qa:
            skipped.append(f"{conv}/s{sess}.{step.segment}")
            continue
        for m in ms:
            samples.append(RewardSample(key=segment_key(conv, sess, step.segment, m), conversation_id=conv,
                                        session=sess, manager=m, messages=step.prompts[m].messages,
                                        expert_outputs=dict(step.outputs), bank_before=step.bank_before, qa=qa,
                                        segment=step.segment))
    if skipped:
        warnings.warn(f"segment_reward_samples: {len(skipped)} segment(s) without a question skipped "
                      f"(e.g. {', '.join(skipped[:3])})", stacklevel=2)
    return samples


def reward_rows(paths: Sequence[str | Path], *, tokenizer, embedder, managers: Sequence[str] = MANAGERS,
                segment_tokens: int | None = None, dataset: str = "locomo", data_path=None, qa_path=None) -> list:
    """The candidate rollout rows of ``paths``: whole-session samples, or segment rows when
    ``segment_tokens`` is set (then ``qa_path`` must be None: ValueError).
    """
    if segment_tokens is None:
        from memgym.rewards.samples import build_reward_samples

        return build_reward_samples(paths, dataset=dataset, data_path=data_path, qa_path=qa_path, embedder=embedder,
                                    managers=managers)
    if qa_path is not None:
        raise ValueError(f"segment rows take their QA from the trajectories' own qa; got qa_path {qa_path!r}")
    return segment_reward_samples(paths, tokenizer=tokenizer, segment_tokens=segment_tokens, embedder=embedder,
                                  managers=managers, dataset=dataset, data_path=data_path)
