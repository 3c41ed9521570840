"""The process side of a sandbox (:mod:`memgym.evolution.execution.sandbox`): its limits, the one
failure type :class:`SandboxError` (with ``kind``), and :class:`SandboxProcess`, the child
process started under ``prlimit`` in its own session, fed and read as JSON lines within
deadlines, and classified (memory, signal, exit) when it stops answering."""
from __future__ import annotations

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


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed program: load/call wall seconds (host serving excluded),
    ``memory_mb`` (MiB) and ``cpu_s`` (None = unlimited), ``max_message_bytes``,
    ``max_stderr_bytes``, ``file_size_mb``, and toolkit argument limits ``max_embed_texts``,
    ``max_text_chars``, ``max_llm_tokens``.
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
    """A sandboxed program failed. ``kind`` (:data:`KINDS`): static | violation | timeout | memory |
    crash | oversized | raised | bad_result | bad_request | host | closed | unconfined (the five
    after static also kill the child); ``stage``: load, construct, index, retrieve, snapshot or
    restore; ``reason``: one line; ``detail``: stderr tail or traceback.
    """

    def __init__(self, reason: str, *, kind: str, stage: str = "", detail: str = ""):
        super().__init__(f"{stage + ': ' if stage else ''}{reason}")
        self.reason, self.stage, self.detail, self.kind = reason, stage, detail, kind


class ProgramRaised(SandboxError):
    """``kind == "raised"``: the candidate raised an ordinary exception (``exc_type``, ``detail`` =
    traceback); the child stays alive. The one failure callers handle apart from the others
    (a retrieve that raised is scored as an empty answer)."""

    def __init__(self, reason: str, *, stage: str = "", detail: str = "", exc_type: str = ""):
        super().__init__(reason, kind="raised", stage=stage, detail=detail)
        self.exc_type = exc_type


#: The failure kinds the child reports by name (anything else is a ``crash``).
CHILD_KINDS = ("violation", "timeout", "memory", "crash", "oversized", "raised", "bad_result", "unconfined")

_BOOTSTRAP = "import sys; sys.path.insert(0, sys.argv[1]); from memgym.evolution.execution.sandbox_child import main; main()"
# argv after the bootstrap: project root, parent pid, "1" if spawned from the main thread (PDEATHSIG)
PROJECT_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


class SandboxProcess:
    """The child process of one sandbox and its pipes: started with the :class:`SandboxLimits`
    (prlimit), spoken to in JSON lines within deadlines, classified when it dies, killed as a
    process group. Every failure is a :class:`SandboxError` (the child is killed first)."""

    def __init__(self, limits: SandboxLimits):
        self.limits = limits
        self._proc: subprocess.Popen | None = None
        self._scratch: str | None = None
        self._lifeline: int | None = None
        self._lifeline_child: int | None = None
        self._buf = bytearray()
        self._stderr = bytearray()
        self._stderr_total = 0

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
                [sys.executable, "-I", "-B", "-c", _BOOTSTRAP, PROJECT_ROOT, str(os.getpid()), "1" if main else "0"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=self._scratch, env=env,
                start_new_session=True, close_fds=True, pass_fds=(r,))
        finally:
            os.close(r)
        self._set_rlimits(self._proc.pid)
        for f in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            os.set_blocking(f.fileno(), False)

    def kernel_cpu_s(self) -> float | None:
        """CPU seconds (user + system) the kernel has charged the child, every thread included,
        from ``/proc/<pid>/stat`` (proc(5)); None where it cannot be read."""
        if self._proc is None:
            return None
        try:
            with open(f"/proc/{self._proc.pid}/stat", "rb") as f:
                fields = f.read().rpartition(b")")[2].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except (OSError, ValueError, IndexError):
            return None

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

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:  # noqa: BLE001 - interpreter shutdown
            pass

    def _fail(self, kind: str, reason: str, stage: str, detail: str = "") -> SandboxError:
        """Kill the child and return the :class:`SandboxError` of ``kind`` (stderr tail as detail)."""
        self._drain_stderr()
        self._kill()
        return SandboxError(reason, kind=kind, stage=stage, detail=detail or self.stderr_tail[-2000:])

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
            return self._fail("memory", "memory limit exceeded", stage)
        if rc is not None and rc < 0:
            sig = -rc
            what = {signal.SIGXCPU: "CPU time limit exceeded", signal.SIGXFSZ: "file size limit exceeded",
                    signal.SIGKILL: "killed (SIGKILL, possibly out of memory)",
                    signal.SIGSEGV: "crashed (segmentation fault)"}.get(sig, f"killed by signal {signal.Signals(sig).name}")
            return self._fail("crash", what, stage)
        return self._fail("crash", f"child exited unexpectedly (status {rc})", stage)

    def _send(self, msg: dict, deadline: float, stage: str) -> None:
        if self._proc is None:
            raise SandboxError("sandbox is closed", kind="closed", stage=stage)
        data = memoryview((json.dumps(msg, ensure_ascii=True) + "\n").encode("ascii"))
        fd = self._proc.stdin.fileno()
        while data:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail("timeout", "child stopped reading its input", stage)
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
                raise self._fail("oversized", f"reply exceeds the {cap}-byte cap", stage)
            if nl >= 0:
                line = bytes(self._buf[:nl])
                del self._buf[: nl + 1]
                try:
                    msg = json.loads(line)
                    if not isinstance(msg, dict):
                        raise ValueError("not an object")
                except ValueError:
                    raise self._fail("crash", f"protocol error: unreadable reply {line[:120]!r}", stage) from None
                return msg
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._fail("timeout", f"no reply within {timeout_s:g} s", stage)
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
