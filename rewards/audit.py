"""Reward audit (``memgym reward audit``): score every (session, manager) of an expert trajectory
with the expert's output and with a control output, and report both means.

Controls: ``shuffled`` = the same manager's output of session t+1 (cyclic, within the
conversation); ``empty`` = no change (``{"operations": []}``, ``{"operation": "NONE"}`` for core).
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np
from tqdm.auto import tqdm

from memgym.memory_bank.actions import MANAGERS
from memgym.rewards.samples import RewardSample

__all__ = ["CONTROLS", "EMPTY_OUTPUTS", "control_outputs", "run_audit"]

CONTROLS = ("shuffled", "empty")
EMPTY_OUTPUTS = {"core": '{"operation": "NONE"}', **{m: '{"operations": []}' for m in MANAGERS[1:]}}


def control_outputs(samples: list[RewardSample], control: str) -> list[str]:
    """One control completion per sample. Raises ValueError for an unknown control, or
    ``shuffled`` on a single-session conversation.
    """
    if control == "empty":
        return [EMPTY_OUTPUTS[s.manager] for s in samples]
    if control != "shuffled":
        raise ValueError(f"unknown control {control!r}; expected one of {CONTROLS}")
    sessions: dict[str, list[int]] = defaultdict(list)
    outputs: dict[tuple[str, int], dict[str, str]] = {}
    for s in samples:
        if (s.conversation_id, s.session) not in outputs:
            sessions[s.conversation_id].append(s.session)
            outputs[(s.conversation_id, s.session)] = s.expert_outputs
    shift: dict[tuple[str, int], int] = {}
    for conv, idx in sessions.items():
        idx = sorted(idx)
        if len(idx) < 2:
            raise ValueError(f"control 'shuffled' needs >= 2 sessions of {conv}, got {len(idx)}")
        for i, t in enumerate(idx):
            shift[(conv, t)] = idx[(i + 1) % len(idx)]
    return [outputs[(s.conversation_id, shift[(s.conversation_id, s.session)])][s.manager] for s in samples]


def _means(rows: list[tuple[str, float, float, int]]) -> dict:
    return {"mean": float(np.mean([r[1] for r in rows])) if rows else 0.0,
            "acc_mean": float(np.mean([r[2] for r in rows])) if rows else 0.0,
            "gate_rate": float(np.mean([r[3] for r in rows])) if rows else 0.0}


def run_audit(samples: list[RewardSample], reward, control: str = "shuffled", batch_size: int = 64,
              progress: bool = True) -> dict:
    """Score ``samples`` with expert and ``control`` outputs under ``reward`` (isolated or
    counterfactual mode). Returns overall and ``by_manager`` means (``expert_mean``,
    ``control_mean``, ``n``, ``*_acc_mean``, ``control_gate_rate``) plus ``control``, ``mode``,
    ``judge``; R in [0, 1]. Raises ValueError for joint mode, no samples or a bad control.
    """
    if reward.config.mode == "joint":
        raise ValueError("the audit scores one manager's output at a time: use counterfactual or isolated mode")
    if not samples:
        raise ValueError("no samples to audit")
    controls = control_outputs(samples, control)
    expert = [s.expert_outputs[s.manager] for s in samples]
    rows = {"expert": [], "control": []}
    for i in tqdm(range(0, len(samples), batch_size), desc=f"audit ({control})", unit="batch", disable=not progress):
        chunk = samples[i: i + batch_size]
        for name, comps in (("expert", expert), ("control", controls)):
            for s, b in zip(chunk, reward(chunk, comps[i: i + batch_size])):
                rows[name].append((s.manager, b.reward, b.acc, b.gate))
    by_manager = {}
    for m in MANAGERS:
        e = _means([r for r in rows["expert"] if r[0] == m])
        c = _means([r for r in rows["control"] if r[0] == m])
        n = sum(r[0] == m for r in rows["expert"])
        if n:
            by_manager[m] = {"expert_mean": e["mean"], "control_mean": c["mean"], "n": n,
                             "expert_acc_mean": e["acc_mean"], "control_acc_mean": c["acc_mean"],
                             "control_gate_rate": c["gate_rate"]}
    e, c = _means(rows["expert"]), _means(rows["control"])
    return {"expert_mean": e["mean"], "control_mean": c["mean"], "n": len(samples), "by_manager": by_manager,
            "expert_acc_mean": e["acc_mean"], "control_acc_mean": c["acc_mean"], "control_gate_rate": c["gate_rate"],
            "control": control, "mode": reward.config.mode, "judge": reward.config.judge}
