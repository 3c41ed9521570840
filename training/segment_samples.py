"""ADRPO reward rows on session segments: the rollout unit of segmented SFT.

Why: the CPU recipe's SFT trains on segments of whole turns (``training.sft_segments``,
``segment_tokens`` transcript tokens each), and an extractor with ``segment_tokens`` builds
banks the same way (``memory_bank.construct.split_session``). A whole-session ADRPO row is a
prompt that policy never saw in SFT nor meets at inference (issue 17: the step-34 SFT policy
sampled the empty output on 12 of 13 whole-session rows, so GRPO had no reward variance). Here
one row is one (conversation, session, segment, manager), built from
:func:`training.sft_segments.segment_steps`:

- prompt: the inference prompt of the segment over the bank as it stands before it (the
  expert bank before the session plus the expert's shares of the earlier segments);
- expert outputs: the expert's share of the session's operations for this segment, for all
  four managers (the counterfactual bank of the dense reward adds the other three);
- QA: the session's questions whose evidence is complete by the end of this segment and was
  not yet complete at the end of the previous one (a question goes to the segment holding the
  latest of its evidence turns; a question with no evidence turn in the session goes to the
  last segment). A segment with no question carries no reward signal and is skipped.

The reward is then the same dense session reward (MemBuilder arXiv 2601.05488 §3.4, Eqs. 5-10:
R = g · acc · (1 − λ·LP), the length penalty against the expert's share for the segment), at
segment granularity. Row keys: ``"<conversation_id>/s<session>.<segment>/<manager>"``.
"""
from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path

from data_synth.qa_format import qa_item_from_json
from memory_bank.actions import MANAGERS
from rewards.samples import RewardSample
from training.sft_data import check_managers, expert_session_states
from training.sft_segments import SegmentStats, segment_steps


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
    """One :class:`rewards.samples.RewardSample` per (session, segment with QA, manager), in
    file and segment order (module docstring), with ``segment`` >= 1 and the key of
    :func:`segment_key`. ``tokenizer`` counts transcript tokens (the policy's, as SFT did);
    ``embedder`` ranks the 20 entries each prompt shows, as at inference.

    Raises ValueError for an unknown manager or ``segment_tokens`` < 1, the errors of
    :func:`training.sft_data.expert_session_states` for a bad trajectory file, SegmentError
    for expert operations that do not apply once split, SessionQAError for a malformed QA item.
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
    """The candidate rollout rows of trajectory files ``paths`` before selection: whole-session
    :func:`rewards.samples.build_reward_samples` (QA from ``qa_path`` or the trajectories), or
    segment rows (:func:`segment_reward_samples`) when ``segment_tokens`` is set (then
    ``qa_path`` must be None: ValueError). ADRPO's training rows, its screen and the validation
    reward all take their rows from here."""
    if segment_tokens is None:
        from rewards.samples import build_reward_samples

        return build_reward_samples(paths, dataset=dataset, data_path=data_path, qa_path=qa_path, embedder=embedder,
                                    managers=managers)
    if qa_path is not None:
        raise ValueError(f"segment rows take their QA from the trajectories' own qa; got qa_path {qa_path!r}")
    return segment_reward_samples(paths, tokenizer=tokenizer, segment_tokens=segment_tokens, embedder=embedder,
                                  managers=managers, dataset=dataset, data_path=data_path)
