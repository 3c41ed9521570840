"""The ``replay`` proposer: answers every coder request from a recorded run, with no server.

A ``coder`` run keeps every model turn of every proposal in its run directory
(``candidates/rNN/proposal.json`` and, for the validation revise turn, ``revise.json``: the
transcript entries ``request`` (every message sent) and ``response`` (the reply, its sha256 and
its token counts) or ``error``; :class:`memgym.evolution.search.proposers.base.ProposalResult`). Recipe
``proposer: replay`` with ``replay_from: RUN`` (``memgym evolve --proposer replay --from RUN``)
runs the same loop with :class:`ReplayProposer`: a :class:`CoderProposer` whose model is the
recording. Each turn's request is rebuilt by the same code and must equal the recorded one,
message by message; the recorded reply (and token counts, so the ledger agrees) is returned.

What is replayed is checked: every recorded reply must match its sha256 and carry valid token
counts (:func:`memgym.llm.base.token_count_problem`; a missing count is estimated with the tokenizer and
booked as an estimate), checked before the first round; and, the offline evaluation being
deterministic, every replayed candidate must equal the recorded one (its row of
:meth:`memgym.evolution.search.archive.Archive.fingerprint`: status, program key, parent, task scores),
and after the recording's last round the whole archive fingerprint must equal RUN's
``state.json``'s (the proposer is a :class:`~memgym.evolution.search.protocols.Callback` of the run).

Errors: :class:`ReplayMismatchError` (a :class:`ProposerError`: the run stops, one line, exit 2)
naming the round when a request differs from the recording (the turn, the message and the first
differing line), asks for a turn the recording does not have, a recorded reply does not match its
sha256 or has an invalid token count, or a replayed candidate or the final archive differs from
the recording; :class:`ProposerError` when RUN holds no recorded coder proposals.
"""
from __future__ import annotations

import random
from pathlib import Path

from memgym.evolution.search.protocols import Callback
from memgym.evolution.search.proposers.base import ProposalInput, ProposalResult, ProposerError
from memgym.evolution.search.proposers.coder import CallFailed, CoderProposer, reply_sha256
from memgym.evolution.search.rundir import check_state, read_json
from memgym.llm.base import Completion, prompt_token_limit, token_count_problem


class ReplayMismatchError(ProposerError):
    """A replay that does not match its recording; ``round`` and ``turn`` (0: not a turn) say where."""

    def __init__(self, message: str, round_no: int, turn: int):
        super().__init__(message)
        self.round, self.turn = round_no, turn


def load_recording(run_dir: str | Path, max_new_tokens: int | None = None) -> dict:
    """``{round: {"propose": [turn, ...], "revise": [turn, ...]}}`` of a recorded run, a turn
    being ``(request entry, response-or-error entry)``, every reply checked against its sha256
    and its token counts (``max_new_tokens``: the recorded run's ``coder_max_new_tokens``, the
    most a completion can count; None: unchecked) by :func:`check_turn`. Raises
    :class:`ProposerError` naming ``run_dir`` when it holds no recorded coder proposal (a missing
    folder, an offline run, a run recorded before requests were kept), :class:`ReplayMismatchError`
    naming the round, turn and file of a reply that fails the checks."""
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
        round_no = int(d.name[1:])
        first = _turns(prop, d / "proposal.json")
        rev = read_json(d / "revise.json")
        more = []
        if rev is not None and rev.get("result") is not None:
            more = _turns(rev, d / "revise.json")[len(first):]
        for n, turn in enumerate(first, 1):
            check_turn(turn, round_no, n, d / "proposal.json", max_new_tokens)
        for n, turn in enumerate(more, 1):
            check_turn(turn, round_no, n, d / "revise.json", max_new_tokens)
        if first or more:
            out[round_no] = {"propose": first, "revise": more}
    if not out:
        raise ProposerError(f"--from {root}: the run holds no recorded coder requests (an offline proposer's run, or "
                            "one recorded before requests were kept)")
    return out


def _turns(record, path: Path) -> list:
    """The (request, response-or-error) pairs of a proposal or revise record's transcript."""
    try:
        entries = [e for e in record["result"]["transcript"] if e.get("role") in ("request", "response", "error")]
    except (KeyError, TypeError, AttributeError) as e:
        raise ProposerError(f"{path}: damaged proposal record: {type(e).__name__}: {e}") from None
    if len(entries) % 2 or any(a["role"] != "request" or b["role"] == "request"
                               for a, b in zip(entries[::2], entries[1::2])):
        raise ProposerError(f"{path}: the transcript is not request/response pairs")
    return list(zip(entries[::2], entries[1::2]))


def check_turn(turn: tuple, round_no: int, n: int, path: Path, max_new_tokens: int | None) -> None:
    """:class:`ReplayMismatchError` naming round ``round_no``, turn ``n`` and ``path`` unless the
    recorded reply (a ``response``) matches its ``sha256`` and its token counts are absent or
    valid (:func:`memgym.llm.base.token_count_problem`; 0 for a response-cache hit, ``cached``)."""
    req, resp = turn
    if resp["role"] != "response":
        return
    where = f"round {round_no}, turn {n}: the recorded reply in {path}"
    content = resp.get("content")
    if not isinstance(content, str) or "sha256" not in resp:
        raise ReplayMismatchError(f"{where} has no {'sha256' if isinstance(content, str) else 'text'}, so it cannot "
                                  "be checked (recorded before replies were hashed, or edited)", round_no, n)
    if reply_sha256(content) != resp["sha256"]:
        raise ReplayMismatchError(f"{where} does not match its sha256: it was edited or damaged after the run",
                                  round_no, n)
    cached = bool(resp.get("cached"))  # a response-cache hit costs 0 tokens
    for key, most, nonempty in (("prompt_tokens", 0 if cached else prompt_token_limit(req.get("messages") or []),
                                 not cached),
                                ("completion_tokens", 0 if cached else max_new_tokens, bool(content) and not cached)):
        if key in resp:
            why = token_count_problem(resp[key], most=float("inf") if most is None else most, nonempty=nonempty)
            if why:
                raise ReplayMismatchError(f"{where} has an invalid {key}: {why}", round_no, n)


def load_recorded_archive(run_dir: str | Path) -> tuple[dict, list, int]:
    """(``{candidate id: fingerprint row}``, the whole fingerprint, the last round) of the
    archive in ``run_dir``'s ``state.json`` (:class:`~memgym.evolution.search.rundir.RunStateError` when
    it is missing or damaged)."""
    from memgym.evolution.search.archive import Archive
    from memgym.evolution.search.journal import load_scores
    from memgym.evolution.search.rundir import RunStateError

    path = Path(run_dir) / "state.json"
    st = read_json(path)
    if st is None:
        raise RunStateError(f"--from {run_dir}: {path} is missing; the replay cannot be checked against the run")
    check_state(st, path)
    try:
        arch = Archive.from_json(st["archive"])
        load_scores(run_dir, arch)
        fp = arch.fingerprint()
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise RunStateError(f"{path}: damaged run state: {type(e).__name__}: {e}") from None
    return {row[0]: row for row in fp[0]}, fp, st["next_round"] - 1


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


_ROW_FIELDS = ("id", "status", "program key", "parent", "train task scores", "valid task scores")


class ReplayProposer(CoderProposer, Callback):
    """See the module doc. ``recording``: :func:`load_recording`'s value; ``facts``: the run's
    facts section, as the coder proposer renders it (it must equal the recorded run's);
    ``archive``: :func:`load_recorded_archive`'s value (None: candidates are not checked)."""

    name = "replay"

    def __init__(self, recording: dict, facts: str = "", source: str = "the recording",
                 archive: tuple | None = None):
        super().__init__(self._chat, facts=facts)
        self.recording, self.source, self.archive = recording, source, archive
        self._queue: list = []
        self._round, self._turn_no = 0, 0

    def _start(self, inp: ProposalInput, part: str) -> None:
        self._round = int(inp.extra.get("round", 0))
        rec = self.recording.get(self._round)
        if rec is None:
            raise ReplayMismatchError(f"round {self._round}: {self.source} has no coder proposal for this round "
                                      f"(recorded rounds: {sorted(self.recording)})", self._round, 1)
        self._queue, self._turn_no = list(rec[part]), 0

    def _chat(self, messages: list[dict]) -> Completion:
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
        text = resp["content"]
        if "prompt_tokens" in resp and "completion_tokens" in resp:
            return Completion(text, resp["prompt_tokens"], resp["completion_tokens"], cached=bool(resp.get("cached")),
                              estimated=bool(resp.get("estimated")))
        from memgym.llm.models import estimate_tokens

        return Completion(text, *estimate_tokens(messages, text), estimated=True)

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

    def on_round_end(self, state, round_no: int) -> None:
        """Every candidate of round ``round_no`` must equal the recorded one; after the
        recording's last round, the whole archive fingerprint must."""
        if self.archive is None:
            return
        rows, whole, last = self.archive
        now = state.archive.fingerprint()
        for row in now[0]:
            cid = row[0]
            if state.archive.candidates[cid].round != round_no or cid not in rows or rows[cid] == row:
                continue
            what = next(name for name, a, b in zip(_ROW_FIELDS, rows[cid], row) if a != b)
            raise ReplayMismatchError(f"round {round_no}: candidate {cid} differs from {self.source} in its {what}: "
                                      f"{_short(rows[cid][_ROW_FIELDS.index(what)])} recorded, "
                                      f"{_short(row[_ROW_FIELDS.index(what)])} replayed", round_no, 0)
        if round_no == last and now != whole:
            what = "candidates" if now[0] != whole[0] else "base" if now[1] != whole[1] else "specialists"
            raise ReplayMismatchError(f"round {round_no}: the archive after the recording's last round differs from "
                                      f"{self.source} in its {what}", round_no, 0)


def _short(v) -> str:
    text = repr(v)
    return text if len(text) <= 80 else text[:79] + "…"
