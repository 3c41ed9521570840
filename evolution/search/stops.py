"""When ``memgym evolve`` must stop instead of going on: a coder endpoint that keeps failing.

A proposer turns a failed model call into a failed proposal (``coder call failed:
BackendRequestError: OpenAIBackend: request to <url> ... failed after N attempt(s) ...``), so
that one bad reply costs one round, not the run. An unreachable server, though, would fail
every round and the run would end with exit 0, "0 candidates evaluated" and the seed as the
final program. :func:`check_endpoint` stops the run after :data:`ENDPOINT_FAILURES_STOP`
consecutive rounds whose proposals failed that way; the run state is saved first, so
``memgym evolve --resume DIR`` continues once the server is back. A shorter run in which every
round's proposal failed that way ends written (report, best.py = the seed) and then raises
:class:`EndpointUnreachable` too (:func:`check_anything_proposed`): it did not evolve anything.
"""
from __future__ import annotations

from memgym.llm.errors import MemgymError

ENDPOINT_FAILURES_STOP = 3
"""Consecutive rounds whose model calls all failed after their retries before the run stops."""

_MARK = "BackendRequestError"


class EndpointUnreachable(MemgymError, RuntimeError):
    """The coder's endpoint failed ``ENDPOINT_FAILURES_STOP`` rounds in a row (message: the last
    error, which names the URL)."""


def endpoint_failure_streak(history: list, archive) -> tuple[int, str]:
    """(consecutive most recent rounds whose candidate failed on a model request, the last
    such reason). ``history``: the run's round records; ``archive``: holds their candidates."""
    n, last = 0, ""
    for row in reversed(history):
        if row.round == 0 or row.candidate not in archive.candidates:
            break
        cand = archive.get(row.candidate)
        if cand.status != "failed" or _MARK not in (cand.reason or ""):
            break
        n += 1
        last = last or cand.reason
    return n, last


def check_endpoint(history: list, archive, limit: int = ENDPOINT_FAILURES_STOP) -> None:
    """Raise :class:`EndpointUnreachable` when the last ``limit`` rounds failed on requests."""
    n, last = endpoint_failure_streak(history, archive)
    if n >= limit:
        raise EndpointUnreachable(f"stopped after {n} consecutive rounds whose model requests failed; last: {last}. "
                                  "Fix the server (or the coder_model URL), then continue with --resume")


def check_anything_proposed(history: list, archive, root) -> None:
    """Raise :class:`EndpointUnreachable` when the run had rounds and every one of them ended in
    a proposal that failed on a model request (``root``: the run directory, named as written)."""
    cands = [archive.get(r.candidate) for r in history if r.round != 0 and r.candidate in archive.candidates]
    if cands and all(c.status == "failed" and _MARK in (c.reason or "") for c in cands):
        raise EndpointUnreachable(f"every proposal of the {len(cands)} round(s) failed because the coder endpoint "
                                  f"failed, so nothing was evolved (the seed is the frozen program); last: "
                                  f"{cands[-1].reason}. "
                                  f"The run directory {root} is written; fix the server (or the coder_model URL) "
                                  "and start a new run")
