"""The ``replay`` proposer: answers every coder request from a recorded run, with no server.

A ``coder`` run keeps every model turn of every proposal in its run directory
(``candidates/rNN/proposal.json`` and, for the validation revise turn, ``revise.json``: the
transcript entries ``request`` (every message sent) and ``response`` (the reply and its token
counts) or ``error``; :class:`evolution.search.proposers.base.ProposalResult`). Recipe
``proposer: replay`` with ``replay_from: RUN`` (``memgym evolve --proposer replay --from RUN``)
runs the same loop with :class:`ReplayProposer`: a :class:`CoderProposer` whose model is the
recording. Each turn's request is rebuilt by the same code and must equal the recorded one,
message by message; the recorded reply (and token counts, so the ledger agrees) is returned.
The offline evaluation being deterministic, the replayed run ends with the recorded run's
archive (:meth:`evolution.search.archive.Archive.fingerprint`) and summary scores.

Errors: :class:`ReplayMismatchError` (a :class:`ProposerError`: the run stops, exit 2) when a
request differs from the recording (the message names the round, the turn, the message and the
first differing line) or asks for a turn the recording does not have; :class:`ProposerError`
when RUN holds no recorded coder proposals.
"""
from __future__ import annotations

import random
from pathlib import Path

from evolution.search.proposers.base import ProposalInput, ProposalResult, ProposerError
from evolution.search.proposers.coder import CallFailed, CoderProposer
from evolution.search.rundir import read_json


class ReplayMismatchError(ProposerError):
    """A request that does not match the recording; ``round`` and ``turn`` say where."""

    def __init__(self, message: str, round_no: int, turn: int):
        super().__init__(message)
        self.round, self.turn = round_no, turn


def load_recording(run_dir: str | Path) -> dict:
    """``{round: {"propose": [turn, ...], "revise": [turn, ...]}}`` of a recorded run, a turn
    being ``(request entry, response-or-error entry)``. Raises :class:`ProposerError` naming
    ``run_dir`` when it holds no recorded coder proposal (a missing folder, an offline run, a
    run recorded before requests were kept)."""
    root = Path(run_dir)
    if not (root / "candidates").is_dir():
        raise ProposerError(f"--from {root}: not a memgym evolve run directory (no candidates/ folder)")
    out = {}
    for d in sorted((root / "candidates").iterdir()):
        if not (d.name.startswith("r") and d.name[1:].isdigit()):
            continue
        prop = read_json(d / "proposal.json")
        if prop is None:
            continue
        first = _turns(prop["result"]["transcript"], d / "proposal.json")
        rev = read_json(d / "revise.json")
        more = []
        if rev is not None and rev.get("result") is not None:
            more = _turns(rev["result"]["transcript"], d / "revise.json")[len(first):]
        if first or more:
            out[int(d.name[1:])] = {"propose": first, "revise": more}
    if not out:
        raise ProposerError(f"--from {root}: the run holds no recorded coder requests (an offline proposer's run, or "
                            "one recorded before requests were kept)")
    return out


def _turns(transcript: list, path: Path) -> list:
    entries = [e for e in transcript if e.get("role") in ("request", "response", "error")]
    if len(entries) % 2 or any(a["role"] != "request" or b["role"] == "request"
                               for a, b in zip(entries[::2], entries[1::2])):
        raise ProposerError(f"{path}: the transcript is not request/response pairs")
    return list(zip(entries[::2], entries[1::2]))


def first_difference(recorded: list[dict], now: list[dict]) -> str:
    """Where two message lists first differ, in words (message index and role, line number,
    both lines); "" when equal."""
    if recorded == now:
        return ""
    if len(recorded) != len(now):
        return f"the recording has {len(recorded)} messages, the request {len(now)}"
    for i, (a, b) in enumerate(zip(recorded, now)):
        if a == b:
            continue
        if a.get("role") != b.get("role"):
            return f"message {i}: role {a.get('role')!r} recorded, {b.get('role')!r} now"
        la, lb = str(a.get("content")).splitlines(), str(b.get("content")).splitlines()
        for n, (x, y) in enumerate(zip(la, lb), 1):
            if x != y:
                return f"message {i} ({a['role']}) line {n}: recorded {x[:160]!r}, now {y[:160]!r}"
        n = min(len(la), len(lb)) + 1
        return (f"message {i} ({a['role']}) has {len(la)} lines recorded, {len(lb)} now; first extra line {n}: "
                f"{(la[n - 1:] or lb[n - 1:])[0][:160]!r}")
    return "the messages differ"


class ReplayProposer(CoderProposer):
    """See the module doc. ``recording``: :func:`load_recording`'s value; ``facts``: the run's
    facts section, as the coder proposer renders it (it must equal the recorded run's)."""

    name = "replay"

    def __init__(self, recording: dict, facts: str = "", source: str = "the recording"):
        super().__init__(self._chat, facts=facts)
        self.recording, self.source = recording, source
        self._queue: list = []
        self._round, self._turn_no = 0, 0

    def _start(self, inp: ProposalInput, part: str) -> None:
        self._round = int(inp.extra.get("round", 0))
        rec = self.recording.get(self._round)
        if rec is None:
            raise ReplayMismatchError(f"round {self._round}: {self.source} has no coder proposal for this round "
                                      f"(recorded rounds: {sorted(self.recording)})", self._round, 1)
        self._queue, self._turn_no = list(rec[part]), 0

    def _chat(self, messages: list[dict]) -> tuple[str, int, int]:
        self._turn_no += 1
        if not self._queue:
            raise ReplayMismatchError(f"round {self._round}, turn {self._turn_no}: {self.source} has no such turn "
                                      "(the replayed proposal asked the coder more often than the recorded one)",
                                      self._round, self._turn_no)
        req, resp = self._queue.pop(0)
        diff = first_difference(req["messages"], messages)
        if diff:
            raise ReplayMismatchError(f"round {self._round}, turn {self._turn_no}: the request does not match "
                                      f"{self.source}: {diff}", self._round, self._turn_no)
        if resp["role"] == "error":
            raise CallFailed(resp["content"])
        return resp["content"], int(resp.get("prompt_tokens", 0)), int(resp.get("completion_tokens", 0))

    def _done(self, result: ProposalResult) -> ProposalResult:
        if self._queue:
            raise ReplayMismatchError(f"round {self._round}: the replayed proposal ended after {self._turn_no} "
                                      f"turn(s), {self.source} has {len(self._queue)} more", self._round,
                                      self._turn_no)
        return result

    def propose(self, inp: ProposalInput, rng: random.Random) -> ProposalResult:
        self._start(inp, "propose")
        return self._done(super().propose(inp, rng))

    def revise(self, inp: ProposalInput, result: ProposalResult, verdict: str,
               rng: random.Random) -> ProposalResult | None:
        self._start(inp, "revise")
        return self._done(super().revise(inp, result, verdict, rng))
