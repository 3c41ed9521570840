"""Run an untrusted memory-program source in a subprocess sandbox.

Source: PrisMem (shared/seeds/000_0e559b88b400976a.txt), appendix "execution checks": candidates
run with allowed imports only, no network, bounded time and memory. The parent never imports
candidate code; :class:`SandboxedProgram` starts ``evolution.execution.sandbox_child`` with

- rlimits set with ``prlimit`` before any candidate code runs: address space (``memory_mb``), CPU seconds over the child's
  life (``cpu_s``), file size (``file_size_mb``), no core dumps; its own session (process
  group), killed as a group on timeout or close;
- ``python -I -B``, cwd = a fresh scratch dir, an environment with nothing but PATH/locale and
  single-threaded BLAS;
- kernel confinement (:mod:`evolution.execution.confine`, the boundary): before the candidate's
  first line the child applies no_new_privs + seccomp + Landlock to itself (reads: stdlib,
  allow-listed packages, system libraries, exact already-imported project files; writes: its
  scratch dir; no network, no exec) and dies with the parent (PDEATHSIG + a reaper on a
  lifeline pipe, which also removes the scratch dir). Where the kernel has no Landlock the
  sandbox refuses to start (:class:`SandboxUnconfined`) unless ``MEMGYM_ALLOW_UNCONFINED_SANDBOX=1``;
  :attr:`SandboxedProgram.confinement` names the mode for reports;
- a first filter with clear messages: imports allow-listed both statically (:func:`static_check`, AST) and at runtime (guarded
  ``__import__`` and the audit hook, see ``evolution/sandbox_child.py``), network, process
  spawning, ctypes and writes outside the scratch dir refused by an audit hook.

Toolkit calls (``toolkit.embed``/``toolkit.llm``) made by the candidate are proxied to the
parent, served by a host-side :class:`memory_bank.program.Toolkit` around the caller's
:class:`~memory_bank.program.ToolkitHost`, and counted there (``stats``); the child needs no
model and no network. Per-call wall time excludes time the parent spends serving the host.

Every failure is an exception of type :class:`SandboxError` with ``kind`` and ``reason``; none
takes the parent down. Violations, timeouts, crashes, memory exhaustion and oversized replies
also kill the child (the object is then closed); :class:`ProgramRaised` (the candidate raised
an ordinary exception) leaves it alive.
"""
from __future__ import annotations

import base64
import dataclasses
import json
import os
import resource
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from typing import Any

import numpy as np

from evolution.execution import confine
from evolution.execution.static_check import DEFAULT_ALLOWED_IMPORTS, FORBIDDEN_ATTRS, FORBIDDEN_NAMES, static_check  # noqa: F401
from memory_bank.program import (BudgetExceededError, ContractError, ProgramInfo, SessionInfo, Toolkit, ToolkitError,
                                 ToolkitHost, contract_from_report)

@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed program.

    load_timeout_s / call_timeout_s: wall seconds for start+load and for each call (time the
    parent spends serving toolkit calls is not counted). memory_mb: address-space limit in MiB
    (None = unlimited). cpu_s: CPU seconds over the child's whole life (None = unlimited).
    max_message_bytes: largest reply line from the child. max_stderr_bytes: stderr kept (tail).
    file_size_mb: largest file the child may write (in its scratch dir). Toolkit argument limits:
    max_embed_texts per call, max_text_chars per text/prompt, max_llm_tokens per call.
    """

    load_timeout_s: float = 20.0
    call_timeout_s: float = 30.0
    memory_mb: int | None = 2048
    cpu_s: int | None = 600
    max_message_bytes: int = 16 << 20
    max_stderr_bytes: int = 64 << 10
    file_size_mb: int = 16
    max_embed_texts: int = 4096
    max_text_chars: int = 100_000
    max_llm_tokens: int = 2048


class SandboxError(Exception):
    """A sandboxed program failed. ``kind``: static | violation | timeout | memory | crash |
    oversized | raised | bad_result | bad_request | host | closed | unconfined; ``stage``: load, construct,
    index, retrieve, snapshot or restore; ``reason``: a one-line human explanation."""

    kind = "error"

    def __init__(self, reason: str, *, stage: str = "", detail: str = "", kind: str | None = None):
        super().__init__(f"{stage + ': ' if stage else ''}{reason}")
        self.reason, self.stage, self.detail = reason, stage, detail
        if kind is not None:  # a finer kind than the class's (SandboxBadResult: bad_request)
            self.kind = kind


class SandboxViolation(SandboxError):
    """A forbidden operation (static source check or runtime audit hook)."""

    kind = "violation"


class SandboxTimeout(SandboxError):
    """No reply within the load/call wall-time limit (the child is killed)."""

    kind = "timeout"


class SandboxMemoryError(SandboxError):
    """The program exhausted the address-space limit (MemoryError; the child is killed)."""

    kind = "memory"


class SandboxCrash(SandboxError):
    """The child died (signal, CPU limit, exit) or broke the protocol."""

    kind = "crash"


class SandboxOversized(SandboxError):
    """A reply exceeded ``max_message_bytes``."""

    kind = "oversized"


class ProgramRaised(SandboxError):
    """The candidate raised an ordinary exception (``exc_type``, ``detail`` = traceback)."""

    kind = "raised"

    def __init__(self, reason: str, *, stage: str = "", detail: str = "", exc_type: str = ""):
        super().__init__(reason, stage=stage, detail=detail)
        self.exc_type = exc_type


class SandboxBadResult(SandboxError):
    """A call returned something that is not JSON (or the host sent arguments the program's
    dataclasses reject: ``kind == "bad_request"``)."""

    kind = "bad_result"


class SandboxHostError(SandboxError):
    """The host's embedder or LLM raised while serving a toolkit call (not the candidate's fault)."""

    kind = "host"


class SandboxUnconfined(SandboxError):
    """Kernel confinement is unavailable (and ``MEMGYM_ALLOW_UNCONFINED_SANDBOX`` is not 1) or the
    kernel refused a confinement step in the child; the program never ran."""

    kind = "unconfined"


class SandboxClosed(SandboxError):
    """A call on a sandbox whose child is no longer running."""

    kind = "closed"


_KINDS = {c.kind: c for c in (SandboxViolation, SandboxTimeout, SandboxMemoryError, SandboxCrash, SandboxOversized,
                              ProgramRaised, SandboxBadResult, SandboxUnconfined)}

_BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[1]); from evolution.execution.sandbox_child import main; main()"
# argv after the bootstrap: project root, parent pid, "1" if spawned from the main thread (PDEATHSIG)
_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _jsonable(x: Any) -> Any:
    if dataclasses.is_dataclass(x) and not isinstance(x, type):  # units, queries, SessionInfo
        return dataclasses.asdict(x)
    return x


class SandboxedProgram:
    """One candidate program alive in a sandboxed child process.

    ``SandboxedProgram(source, host, limits, llm_budget=0, embed_budget=None)`` checks the
    source statically (unless ``skip_static_check``), starts the child and loads the module
    (raising :class:`SandboxError` on failure; ``report`` then holds nothing). After a
    successful load ``report`` is the :func:`memory_bank.program.describe_module` report and
    ``info`` the validated :class:`ProgramInfo` (raises ContractError if the contract is broken).

    ``call("index", units, session)`` / ``call("retrieve", query)`` run the methods of ONE
    persistent ``Memory`` instance (constructed on first use, or explicitly by
    :meth:`construct`, which also resets it). Units/queries are dicts or dataclass instances
    (sent as JSON and rebuilt as the program's own classes); ``session`` a dict or
    :class:`SessionInfo`. ``index`` returns what the program returned (the contract says None),
    ``retrieve`` its value (the contract says a str of at most 16,000 characters; that is
    judged by the validator, not here). Usable as a context manager; :meth:`close` is idempotent.

    ``confinement``: ``"auto"`` (kernel confinement, see the module docstring; raises
    :class:`SandboxUnconfined` where the kernel offers none and the switch is unset) or ``"off"``
    (explicitly unconfined: the cost benchmark's baseline). :attr:`confinement` is the label.
    """

    def __init__(self, source: str, host: ToolkitHost | None = None, limits: SandboxLimits | None = None, *,
                 llm_budget: int = 0, embed_budget: int | None = None,
                 allowed_imports: frozenset = DEFAULT_ALLOWED_IMPORTS, skip_static_check: bool = False,
                 filename: str = "<memory-program>", confinement: str = "auto"):
        self.limits = limits or SandboxLimits()
        self._lifeline: int | None = None
        self.report: dict | None = None
        self._info: ProgramInfo | None = None
        self._constructed = False
        self._proc: subprocess.Popen | None = None
        self._scratch: str | None = None
        self._buf = bytearray()
        self._stderr = bytearray()
        self._stderr_total = 0
        self.stats = {"calls": 0, "cpu_s": 0.0, "wall_s": 0.0, "host_s": 0.0}
        if not isinstance(source, str):
            raise SandboxViolation(f"source must be str, got {type(source).__name__}", stage="load")
        if not skip_static_check:
            problems = static_check(source, allowed_imports)
            if problems:
                raise SandboxViolation("; ".join(problems[:5]) + (f" (+{len(problems) - 5} more)" if len(problems) > 5 else ""),
                                       stage="load")
        try:
            self._mode = confine.resolve(confinement)
        except confine.UnconfinedRefused as e:
            raise SandboxUnconfined(str(e), stage="load") from None
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
            cfg["protect"] = confine.protected_paths(_ROOT)
            cfg["lifeline"] = self._lifeline_child
            self.report = self._exchange(cfg, "load", lim.load_timeout_s)
        except BaseException:
            self.close()
            raise

    # ------------------------------------------------------------------ lifecycle

    def _set_rlimits(self, pid: int) -> None:
        """Apply the limits to the started child with prlimit(2) (thread-safe, unlike
        ``preexec_fn``); the child runs no candidate code before the load message is sent."""
        lim = self.limits
        if lim.memory_mb is not None:
            b = int(lim.memory_mb) << 20
            resource.prlimit(pid, resource.RLIMIT_AS, (b, b))
        if lim.cpu_s is not None:
            resource.prlimit(pid, resource.RLIMIT_CPU, (int(lim.cpu_s), int(lim.cpu_s) + 1))
        fs = int(lim.file_size_mb) << 20
        resource.prlimit(pid, resource.RLIMIT_FSIZE, (fs, fs))
        resource.prlimit(pid, resource.RLIMIT_CORE, (0, 0))

    def _start(self) -> None:
        self._scratch = tempfile.mkdtemp(prefix="memgym-sandbox-")
        env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8", "HOME": self._scratch,
               "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "TMPDIR": self._scratch}
        r, w = os.pipe()  # the lifeline: the child's reaper reads EOF when this process dies
        self._lifeline, self._lifeline_child = w, r
        main = threading.current_thread() is threading.main_thread()
        try:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-B", "-c", _BOOTSTRAP, _ROOT, str(os.getpid()), "1" if main else "0"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self._scratch, env=env,
                start_new_session=True, close_fds=True, pass_fds=(r,))
        finally:
            os.close(r)
        self._set_rlimits(self._proc.pid)
        for f in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            os.set_blocking(f.fileno(), False)

    @property
    def alive(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    @property
    def stderr_tail(self) -> str:
        """The last ``max_stderr_bytes`` of the child's stderr (the candidate's prints)."""
        return self._stderr.decode("utf-8", "replace")

    @property
    def stderr_bytes(self) -> int:
        """Total bytes the child wrote to stderr (kept or not)."""
        return self._stderr_total

    def _kill(self) -> None:
        if self._proc is None:
            return
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        try:
            self._proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass

    def close(self) -> None:
        """Stop the child (its whole process group) and delete the scratch dir."""
        if self._proc is not None:
            if self._proc.poll() is None:
                try:
                    self._send({"op": "exit"}, time.monotonic() + 1.0, "close")
                    self._proc.wait(timeout=1.0)
                except (SandboxError, subprocess.TimeoutExpired, OSError):
                    pass
            self._kill()
            for f in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
                try:
                    f.close()
                except OSError:
                    pass
            self._proc = None
        if self._lifeline is not None:
            os.close(self._lifeline)
            self._lifeline = None
        if self._scratch is not None:
            shutil.rmtree(self._scratch, ignore_errors=True)
            self._scratch = None

    def __enter__(self) -> "SandboxedProgram":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    # ------------------------------------------------------------------ I/O

    def _fail(self, cls: type, reason: str, stage: str, detail: str = "") -> SandboxError:
        self._drain_stderr()
        self._kill()
        return cls(reason, stage=stage, detail=detail or self.stderr_tail[-2000:])

    def _drain_stderr(self) -> None:
        if self._proc is None or self._proc.stderr.closed:
            return
        while True:
            try:
                chunk = os.read(self._proc.stderr.fileno(), 1 << 16)
            except (BlockingIOError, OSError):
                return
            if not chunk:
                return
            self._keep_stderr(chunk)

    def _keep_stderr(self, chunk: bytes) -> None:
        self._stderr_total += len(chunk)
        self._stderr += chunk
        cap = self.limits.max_stderr_bytes
        if len(self._stderr) > cap:
            del self._stderr[: len(self._stderr) - cap]

    def _death(self, stage: str) -> SandboxError:
        """Classify a child that stopped answering."""
        try:
            rc = self._proc.wait(timeout=2)
        except subprocess.TimeoutExpired:
            rc = None
        self._drain_stderr()
        tail = self.stderr_tail
        if "MemoryError" in tail[-2000:]:
            return self._fail(SandboxMemoryError, "memory limit exceeded", stage)
        if rc is not None and rc < 0:
            sig = -rc
            what = {signal.SIGXCPU: "CPU time limit exceeded", signal.SIGXFSZ: "file size limit exceeded",
                    signal.SIGKILL: "killed (SIGKILL, possibly out of memory)",
                    signal.SIGSEGV: "crashed (segmentation fault)"}.get(sig, f"killed by signal {signal.Signals(sig).name}")
            return self._fail(SandboxCrash, what, stage)
        return self._fail(SandboxCrash, f"child exited unexpectedly (status {rc})", stage)

    def _send(self, msg: dict, deadline: float, stage: str) -> None:
        if self._proc is None:
            raise SandboxClosed("sandbox is closed", stage=stage)
        data = memoryview((json.dumps(msg, ensure_ascii=True) + "\n").encode("ascii"))
        fd = self._proc.stdin.fileno()
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(SandboxTimeout, "child stopped reading its input", stage)
            _, w, _ = select.select([], [fd], [], remaining)
            if not w:
                continue
            try:
                n = os.write(fd, data)
            except BlockingIOError:
                continue
            except (BrokenPipeError, OSError):
                raise self._death(stage) from None
            data = data[n:]

    def _recv(self, deadline: float, stage: str, timeout_s: float) -> dict:
        out_fd, err_fd = self._proc.stdout.fileno(), self._proc.stderr.fileno()
        cap = self.limits.max_message_bytes
        err_open = True
        while True:
            nl = self._buf.find(b"\n")
            if nl > cap or (nl < 0 and len(self._buf) > cap):
                raise self._fail(SandboxOversized, f"reply exceeds the {cap}-byte cap", stage)
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                try:
                    msg = json.loads(line)
                    if not isinstance(msg, dict):
                        raise ValueError("not an object")
                except ValueError:
                    raise self._fail(SandboxCrash, f"protocol error: unreadable reply {line[:120]!r}", stage) from None
                return msg
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail(SandboxTimeout, f"no reply within {timeout_s:g} s", stage)
            ready, _, _ = select.select([out_fd] + ([err_fd] if err_open else []), [], [], remaining)
            if err_fd in ready:
                chunk = os.read(err_fd, 1 << 16)
                if chunk:
                    self._keep_stderr(chunk)
                else:
                    err_open = False
            if out_fd in ready:
                chunk = os.read(out_fd, 1 << 20)
                if not chunk:
                    raise self._death(stage)
                self._buf += chunk

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
            raise self._fail(SandboxHostError, f"toolkit host failed on {msg.get('op')}: {type(e).__name__}: {e}",
                             stage) from e

    def _exchange(self, msg: dict, stage: str, timeout_s: float) -> Any:
        """Send one request, serve toolkit calls until its result arrives, return the value."""
        if not self.alive:
            raise SandboxClosed("sandbox is closed (the child is not running)", stage=stage)
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
                raise self._fail(SandboxCrash, f"protocol error: unexpected reply type {reply.get('type')!r}", stage)
            break
        self.stats["calls"] += 1
        self.stats["host_s"] += host_s
        self.stats["wall_s"] += time.monotonic() - t0 - host_s
        self.stats["cpu_s"] += float(reply.get("cpu_s", 0.0))
        if reply.get("ok"):
            return reply.get("value")
        kind = reply.get("kind", "raised")
        message = str(reply.get("message", ""))
        if kind == "raised":
            raise ProgramRaised(f"{reply.get('exc_type', 'Exception')}: {message}", stage=stage,
                                detail=str(reply.get("traceback", "")), exc_type=str(reply.get("exc_type", "")))
        if kind == "bad_request":
            raise SandboxBadResult(f"arguments rejected by the program's classes: {reply.get('exc_type', '')}: "
                                   f"{message}", stage=stage, detail=str(reply.get("traceback", "")), kind="bad_request")
        if kind in ("bad_result", "oversized"):
            raise _KINDS[kind](message, stage=stage)
        if kind == "memory":
            raise self._fail(SandboxMemoryError, f"memory limit exceeded ({message or 'MemoryError'})", stage)
        raise self._fail(_KINDS.get(kind, SandboxCrash), message or kind, stage)

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

    def call(self, method: str, *args: Any) -> Any:
        """``call("index", units, session)`` or ``call("retrieve", query)``."""
        if method not in ("index", "retrieve"):
            raise ValueError(f"method must be 'index' or 'retrieve', got {method!r}")
        want = 2 if method == "index" else 1
        if len(args) != want:
            raise TypeError(f"{method} takes {want} argument(s), got {len(args)}")
        if not self._constructed:
            self.construct()
        if method == "index":
            units, session = args
            msg = {"op": "index", "units": [_jsonable(u) for u in units], "session": _jsonable(session)}
        else:
            msg = {"op": "retrieve", "query": _jsonable(args[0])}
        return self._exchange(msg, method, self.limits.call_timeout_s)

    def index(self, units: list, session: dict | SessionInfo) -> Any:
        """``call("index", units, session)``: units are dicts/dataclasses of the MemoryUnit schema."""
        return self.call("index", units, session)

    def retrieve(self, query: Any) -> Any:
        """``call("retrieve", query)``: query is a dict/dataclass of the Query schema."""
        return self.call("retrieve", query)

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
