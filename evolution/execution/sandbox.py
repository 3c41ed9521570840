"""Run an untrusted memory-program source in a subprocess sandbox.

Source: PrisMem (arXiv 2610.06361), appendix "execution checks": allowed
imports only, no network, bounded time and memory. The child (``memgym.evolution.execution.sandbox_child``)
runs under ``prlimit`` rlimits in its own session, ``python -I -B`` in a scratch dir with a
minimal environment, confined by the kernel (:mod:`memgym.evolution.execution.confine`; refused
without Landlock unless ``MEMGYM_ALLOW_UNCONFINED_SANDBOX=1``), behind a static check and an
audit hook. Toolkit calls are proxied to the parent and counted there; per-call wall time
excludes host serving time. Every failure is a :class:`SandboxError`; violations, timeouts,
crashes, memory exhaustion and oversized replies also kill the child, while
:class:`ProgramRaised` leaves it alive.
"""
from __future__ import annotations

import base64
import dataclasses
import time
from typing import Any

import numpy as np

from memgym.evolution.execution import confine
from memgym.evolution.execution.sandbox_process import (CHILD_KINDS, PROJECT_ROOT, ProgramRaised, SandboxError, SandboxLimits,
                                                 SandboxProcess)
from memgym.evolution.execution.static_check import DEFAULT_ALLOWED_IMPORTS, static_check
from memgym.memory_bank.contract import (BudgetExceededError, ContractError, ProgramInfo, SessionInfo, Toolkit, ToolkitError,
                                 ToolkitHost, contract_from_report)


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):  # units, queries, SessionInfo
        return dataclasses.asdict(x)
    return x


class SandboxedProgram(SandboxProcess):
    """One candidate program alive in a sandboxed child process.

    Construction checks the source statically (unless ``skip_static_check``), starts the child and
    loads the module (:class:`SandboxError` on failure); ``report`` / ``info`` then describe it
    (ContractError for a broken contract). :meth:`index` and :meth:`retrieve` run ONE
    persistent ``Memory`` (reset by :meth:`construct`).
    ``confinement``: ``"auto"`` or ``"off"`` (explicitly unconfined). A context manager;
    :meth:`close` is idempotent.
    """

    def __init__(self, source: str, host: ToolkitHost | None = None, limits: SandboxLimits | None = None, *,
                 llm_budget: int = 0, embed_budget: int | None = None,
                 allowed_imports: frozenset = DEFAULT_ALLOWED_IMPORTS, skip_static_check: bool = False,
                 filename: str = "<memory-program>", confinement: str = "auto"):
        super().__init__(limits or SandboxLimits())
        self.report: dict | None = None
        self._info: ProgramInfo | None = None
        self._constructed = False
        self.stats = {"calls": 0, "cpu_s": 0.0, "wall_s": 0.0, "host_s": 0.0}
        self._cpu_seen: dict[str, float] = {}  # the child's and the kernel's CPU totals at the last result
        if not isinstance(source, str):
            raise SandboxError(f"source must be str, got {type(source).__name__}", kind="violation", stage="load")
        if not skip_static_check:
            problems = static_check(source, allowed_imports)
            if problems:
                raise SandboxError("; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
                                   kind="violation", stage="load")
        try:
            self._mode = confine.resolve(confinement)
        except confine.UnconfinedRefused as e:
            raise SandboxError(str(e), kind="unconfined", stage="load") from None
        self.confinement = self._mode.label
        if not self._mode.kernel and confinement == "auto":
            confine.warn_unconfined(self.confinement)
        lim = self.limits
        self.toolkit = Toolkit(host if host is not None else _NoHost(), llm_budget=llm_budget, embed_budget=embed_budget,
                               max_embed_texts=lim.max_embed_texts, max_text_chars=lim.max_text_chars,
                               max_llm_tokens=lim.max_llm_tokens)
        cfg = {"op": "load", "source": source, "filename": filename, "allowed_imports": sorted(allowed_imports),
               "llm_budget": llm_budget, "embed_budget": embed_budget, "max_message_bytes": lim.max_message_bytes,
               "toolkit_limits": {"max_embed_texts": lim.max_embed_texts, "max_text_chars": lim.max_text_chars,
                                  "max_llm_tokens": lim.max_llm_tokens}}
        try:
            self._start()
            cfg["scratch"] = self._scratch
            cfg["confine"] = self._mode.kernel
            cfg["protect"] = confine.protected_paths(PROJECT_ROOT)
            cfg["lifeline"] = self._lifeline_child
            self.report = self._exchange(cfg, "load", lim.load_timeout_s)
        except BaseException:
            self.close()
            raise

    def _serve_toolkit(self, msg: dict, stage: str) -> dict:
        """Answer one proxied toolkit request with the host-side Toolkit (counted there)."""
        try:
            if msg.get("op") == "embed":
                arr = self.toolkit.embed_array(msg.get("texts"))
                return {"ok": True, "b64": base64.b64encode(np.ascontiguousarray(arr, dtype=np.float32).tobytes()).decode(),
                        "shape": list(arr.shape)}
            if msg.get("op") == "llm":
                return {"ok": True, "text": self.toolkit.llm(msg.get("prompt"), msg.get("max_tokens", 256))}
            return {"ok": False, "error": f"unknown toolkit op {msg.get('op')!r}"}
        except BudgetExceededError as e:
            return {"ok": False, "error": str(e), "budget": e.kind}
        except ToolkitError as e:
            return {"ok": False, "error": str(e)}
        except Exception as e:  # noqa: BLE001 - the host's failure, reported as such
            raise self._fail("host", f"toolkit host failed on {msg.get('op')}: {type(e).__name__}: {e}",
                             stage) from e

    def _exchange(self, msg: dict, stage: str, timeout_s: float) -> Any:
        """Send one request, serve toolkit calls until its result arrives, return the value."""
        if not self.alive:
            raise SandboxError("sandbox is closed (the child is not running)", kind="closed", stage=stage)
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        host_s = 0.0
        self._send(msg, deadline, stage)
        while True:
            reply = self._recv(deadline, stage, timeout_s)
            if reply.get("type") == "toolkit":
                h0 = time.monotonic()
                answer = self._serve_toolkit(reply, stage)
                spent = time.monotonic() - h0
                host_s += spent
                deadline += spent
                self._send(answer, deadline, stage)
                continue
            if reply.get("type") != "result":
                raise self._fail("crash", f"protocol error: unexpected reply type {reply.get('type')!r}", stage)
            break
        self.stats["calls"] += 1
        self.stats["host_s"] += host_s
        self.stats["wall_s"] += time.monotonic() - t0 - host_s
        self.stats["cpu_s"] += self._charge_cpu(reply)
        if reply.get("ok"):
            return reply.get("value")
        kind = reply.get("kind", "raised")
        message = str(reply.get("message", ""))
        if kind == "raised":
            raise ProgramRaised(f"{reply.get('exc_type', 'Exception')}: {message}", stage=stage,
                                detail=str(reply.get("traceback", "")), exc_type=str(reply.get("exc_type", "")))
        if kind == "bad_request":
            raise SandboxError(f"arguments rejected by the program's classes: {reply.get('exc_type', '')}: "
                               f"{message}", kind="bad_request", stage=stage, detail=str(reply.get("traceback", "")))
        if kind in ("bad_result", "oversized"):
            raise SandboxError(message, kind=kind, stage=stage)
        if kind == "memory":
            raise self._fail("memory", f"memory limit exceeded ({message or 'MemoryError'})", stage)
        raise self._fail(kind if kind in CHILD_KINDS else "crash", message or kind, stage)

    def _charge_cpu(self, reply: dict) -> float:
        """CPU seconds to charge for the call ``reply`` ends: the child's process CPU (every thread)
        since the previous result, as it reports it (``cpu_total``) and as the kernel counts it,
        whichever is larger, so CPU spent between calls (a thread left running) is charged to the
        next call; the first result is charged its own ``cpu_s``."""
        charged = float(reply.get("cpu_s", 0.0))
        for what, total in (("child", reply.get("cpu_total")), ("kernel", self.kernel_cpu_s())):
            if isinstance(total, (int, float)):
                if what in self._cpu_seen:
                    charged = max(charged, float(total) - self._cpu_seen[what])
                self._cpu_seen[what] = float(total)
        return charged

    # ------------------------------------------------------------------ API

    @property
    def info(self) -> ProgramInfo:
        """The program's validated contract (schemas + instructions); ContractError if broken."""
        if self._info is None:
            if self.report is None:
                raise ContractError("program did not load", level=1)
            self._info = contract_from_report(self.report)
        return self._info

    @property
    def toolkit_calls(self) -> dict:
        """Host-side toolkit counts {"llm", "embed", "embed_texts", "refused"}."""
        return dict(self.toolkit.calls)

    def construct(self) -> None:
        """(Re)create the ``Memory(toolkit)`` instance."""
        self._exchange({"op": "construct"}, "construct", self.limits.call_timeout_s)
        self._constructed = True

    def index(self, units: list, session: dict | SessionInfo) -> Any:
        """Run ``Memory.index(units, session)``: units are dicts/dataclasses of the MemoryUnit schema."""
        return self._call({"op": "index", "units": [_jsonable(u) for u in units], "session": _jsonable(session)})

    def retrieve(self, query: Any) -> Any:
        """Run ``Memory.retrieve(query)``: query is a dict/dataclass of the Query schema."""
        return self._call({"op": "retrieve", "query": _jsonable(query)})

    def _call(self, msg: dict) -> Any:
        if not self._constructed:
            self.construct()
        return self._exchange(msg, msg["op"], self.limits.call_timeout_s)

    def snapshot(self) -> bytes:
        """The Memory instance's state, pickled INSIDE the child (opaque to the parent, which
        never unpickles it). Pass it to another sandbox's :meth:`restore` to reuse indexing."""
        if not self._constructed:
            self.construct()
        return base64.b64decode(self._exchange({"op": "snapshot"}, "snapshot", self.limits.call_timeout_s))

    def restore(self, blob: bytes) -> None:
        """Replace the Memory instance with one unpickled (in the child, under the audit hook)
        from :meth:`snapshot` output; classes resolve against THIS program's module."""
        self._exchange({"op": "restore", "blob": base64.b64encode(blob).decode("ascii")}, "restore",
                       self.limits.call_timeout_s)
        self._constructed = True


class _NoHost:
    """Host used when none is given: every toolkit call fails with ToolkitError."""

    def embed(self, texts):
        raise ToolkitError("no toolkit host: embed is unavailable")

    def llm(self, prompt, max_tokens):
        raise ToolkitError("no toolkit host: llm is unavailable")
