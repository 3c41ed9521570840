"""Child side of :mod:`memgym.evolution.execution.sandbox`: load ONE candidate memory program and serve
calls as JSON lines on private copies of the original stdin/stdout (fd 0 is /dev/null, fd 1
and ``sys.stdout`` are stderr). Never imports model code.

First filter (not the boundary): builtins without eval/exec/compile/input/breakpoint, an
allow-list ``__import__`` that hands out module views and a guarded ``getattr``
(:mod:`memgym.evolution.execution.module_view`: no module object outside the allow list is ever reachable);
a permanent audit hook refusing sockets, process spawning, ctypes, signals, env changes, threads,
code objects, frame and code introspection from the candidate's own code, introspection attributes
in source compiled at run time, writes outside the scratch dir, reads outside the kernel grants,
and non-allow-listed imports and unpickled globals. A refused event raises
:class:`SandboxViolationError` (a BaseException) and is recorded. The boundary is
:mod:`memgym.evolution.execution.confine`, applied before the candidate's first line. Every result
carries ``cpu_total``, the process's CPU seconds over all its threads so far, so the parent charges
CPU spent between calls too.
"""
from __future__ import annotations

import base64
import builtins
import importlib
import json
import linecache
import os
import pickle
import sys
import time
import traceback
import types

import numpy as np

from memgym.evolution.execution import confine
from memgym.evolution.execution.module_view import NamespaceGuard
from memgym.evolution.execution.static_check import introspection_problems
from memgym.memory_bank.contract import BudgetExceededError, Toolkit, ToolkitError, describe_module

MODULE_NAME = "memgym_candidate"
# Unpickling (restore) may only resolve globals from these modules (plus the candidate's).
_PICKLE_MODULES = {"numpy", "collections", "datetime", "copyreg", "_codecs"}
_PICKLE_BUILTINS = {"set", "frozenset", "list", "dict", "tuple", "complex", "slice", "range", "bytearray",
                    "bytes", "object", "int", "float", "str", "bool"}
_REMOVED_BUILTINS = ("eval", "exec", "compile", "input", "breakpoint", "exit", "quit", "help",
                     "copyright", "credits", "license", "__loader__", "__spec__")
_BLOCKED_EVENTS = {
    "subprocess.Popen", "os.system", "os.exec", "os.fork", "os.forkpty", "os.posix_spawn", "os.spawn",
    "os.kill", "os.killpg", "os.putenv", "os.unsetenv", "os.chdir", "os.startfile", "pty.spawn",
    "sys.addaudithook", "sys.setprofile", "sys.settrace", "sys._current_frames", "code.__new__",
    "function.__new__", "gc.get_objects", "gc.get_referrers", "gc.get_referents", "builtins.input",
    "builtins.breakpoint", "_thread.start_new_thread", "mmap.__new__", "resource.setrlimit",
    "resource.prlimit", "webbrowser.open", "marshal.load", "marshal.dumps", "setopencookie",
}
_BLOCKED_PREFIXES = ("socket.", "ctypes.", "urllib.", "http.", "ftplib.", "smtplib.", "imaplib.", "poplib.",
                     "nntplib.", "telnetlib.", "sqlite3.", "signal.", "fcntl.", "syslog.", "winreg.", "msvcrt.",
                     "_winapi.", "shutil.")
_READ_EVENTS = {"os.listdir", "os.scandir", "os.getxattr", "os.listxattr", "os.fwalk", "os.walk", "glob.glob"}
_WRITE_EVENTS = {"os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.link",
                 "os.symlink", "os.truncate", "os.utime", "os.setxattr", "os.removexattr", "os.chflags",
                 "os.lchflags", "os.lchmod", "os.mkfifo", "os.mknod"}
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC


class SandboxViolationError(BaseException):
    """Raised inside the child when the candidate attempts a forbidden operation."""


class SandboxImportError(ImportError):
    """A candidate imported a module outside the allow-list (an ordinary, catchable error)."""


_violations: list[str] = []


def violate(what: str) -> None:
    """Record a violation and raise :class:`SandboxViolationError`."""
    _violations.append(what)
    raise SandboxViolationError(what)


class Channel:
    """JSON-lines framing over two private fds."""

    def __init__(self, in_fd: int, out_fd: int, max_bytes: int):
        self.rfile = os.fdopen(in_fd, "rb", buffering=1 << 16)
        self.out_fd, self.max_bytes = out_fd, max_bytes

    def recv(self) -> dict:
        line = self.rfile.readline()
        if not line:
            os._exit(0)  # parent went away
        return json.loads(line)

    def send(self, msg: dict) -> None:
        data = (json.dumps(msg, ensure_ascii=True, allow_nan=False) + "\n").encode("ascii")
        if len(data) > self.max_bytes:
            raise OverflowError(f"message of {len(data)} bytes exceeds the {self.max_bytes}-byte cap")
        view = memoryview(data)
        while view:
            n = os.write(self.out_fd, view)
            view = view[n:]


class ParentHost:
    """ToolkitHost that forwards embed/llm calls to the parent process."""

    def __init__(self, chan: Channel):
        self.chan = chan

    def _request(self, msg: dict) -> dict:
        try:
            self.chan.send(msg)
        except OverflowError as e:
            raise ToolkitError(f"toolkit request too large: {e}") from None
        resp = self.chan.recv()
        if not resp.get("ok"):
            if resp.get("budget"):
                raise BudgetExceededError(resp.get("error", "budget exhausted"), resp["budget"])
            raise ToolkitError(resp.get("error", "toolkit call failed"))
        return resp

    def embed(self, texts: list[str]) -> np.ndarray:
        resp = self._request({"type": "toolkit", "op": "embed", "texts": texts})
        raw = base64.b64decode(resp["b64"])
        return np.frombuffer(raw, dtype=np.float32).reshape(resp["shape"])

    def llm(self, prompt: str, max_tokens: int) -> str:
        return self._request({"type": "toolkit", "op": "llm", "prompt": prompt, "max_tokens": max_tokens})["text"]


def _under(path: str, roots: tuple[str, ...]) -> bool:
    real = os.path.realpath(path)
    return any(real == r or real.startswith(r.rstrip(os.sep) + os.sep) for r in roots)


def make_audit_hook(scratch: str, read_roots: tuple[str, ...], allowed_modules: frozenset, module_name: str,
                    filename: str = "<memory-program>"):
    """The always-on audit hook (see the module docstring); ``filename``: the candidate's code."""
    scratch_roots = (os.path.realpath(scratch),)
    read_roots = tuple(os.path.realpath(r) for r in read_roots) + scratch_roots
    busy = [False]

    def path_ok(p, roots) -> bool:
        if isinstance(p, int) or p is None:
            return False
        try:
            return _under(os.fsdecode(p), roots)
        except (TypeError, ValueError):
            return False

    def hook(event: str, args: tuple) -> None:
        if busy[0]:
            return
        busy[0] = True
        try:
            if event in _BLOCKED_EVENTS or event.startswith(_BLOCKED_PREFIXES):
                violate(f"forbidden operation: {event}")
            elif event in ("sys._getframe", "object.__getattr__"):
                try:
                    asker = sys._getframe(1).f_code.co_filename
                except ValueError:  # raised from C with no Python frame above the hook
                    asker = None
                if asker == filename:  # the candidate's own line asked
                    what = f"{type(args[0]).__name__}.{args[1]}" if event == "object.__getattr__" else event
                    violate(f"frame and code introspection is not allowed: {what}")
            elif event == "compile" and isinstance(args[0], (str, bytes)):
                problems = introspection_problems(args[0])
                if problems:
                    violate(f"introspection in code compiled at run time: {problems[0]}")
            elif event == "open":
                path, mode, flags = args
                write = bool(mode and any(c in mode for c in "wax+")) or bool((flags or 0) & _WRITE_FLAGS)
                if write and not path_ok(path, scratch_roots):
                    violate(f"write outside the scratch dir: open({path!r}, {mode!r})")
                if not write and not path_ok(path, read_roots):
                    violate(f"read outside the allowed roots: open({path!r})")
            elif event in _WRITE_EVENTS:
                paths = [a for a in args if isinstance(a, (str, bytes, os.PathLike))]
                if not paths or not all(path_ok(p, scratch_roots) for p in paths):
                    violate(f"file mutation outside the scratch dir: {event}{args!r}")
            elif event in _READ_EVENTS:
                p = args[0] if args else None
                if not path_ok("." if p is None else p, read_roots):
                    violate(f"directory read outside the allowed roots: {event}({p!r})")
            elif event.startswith("os."):
                violate(f"forbidden operation: {event}")
            elif event == "import":
                top = str(args[0]).partition(".")[0]
                if top not in allowed_modules:
                    violate(f"loading module {args[0]!r} is not allowed")
            elif event == "pickle.find_class":
                mod, name = args
                top = str(mod).partition(".")[0]
                if not (mod == module_name or top in _PICKLE_MODULES
                        or (mod == "builtins" and name in _PICKLE_BUILTINS)):
                    violate(f"unpickling {mod}.{name} is not allowed")
        finally:
            busy[0] = False

    return hook


def project_root() -> str:
    """The checkout this child was started from (the folder holding ``evolution/``)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def make_builtins(allowed: frozenset, guard: NamespaceGuard | None = None) -> dict:
    """The candidate's ``__builtins__``: no eval/exec/compile/input/..., guarded ``__import__``
    (handing out ``guard``'s module views) and ``getattr``."""
    real_import = builtins.__import__
    guard = guard or NamespaceGuard(allowed, violate)

    def guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
        if level:
            raise SandboxImportError("relative imports are not allowed in memory programs")
        top = name.partition(".")[0]
        if top not in allowed:
            raise SandboxImportError(f"import of {name!r} is not allowed (allowed: {', '.join(sorted(allowed))})")
        return guard.screen(real_import(name, globals, locals, fromlist, level), f"import {name}")

    b = dict(vars(builtins))
    for n in _REMOVED_BUILTINS:
        b.pop(n, None)
    b["__import__"] = guarded_import
    b["getattr"] = guard.guarded_getattr()
    return b


def _error(kind: str, e: BaseException, filename: str) -> dict:
    if _violations:
        return {"type": "result", "ok": False, "kind": "violation", "message": _violations[0],
                "cpu_total": time.process_time()}
    if isinstance(e, MemoryError):
        kind = "memory"
    try:
        tb = "".join(traceback.format_exception(type(e), e, e.__traceback__))[-4000:]
    except BaseException:  # noqa: BLE001 - formatting must never kill the reply
        tb = ""
    try:
        msg = str(e)[:2000]
    except BaseException:  # noqa: BLE001
        msg = "<unprintable>"
    return {"type": "result", "ok": False, "kind": kind, "exc_type": type(e).__name__, "message": msg, "traceback": tb,
            "cpu_total": time.process_time()}


class _Persist(pickle.Pickler):
    def __init__(self, f, toolkit):
        super().__init__(f, protocol=5)
        self._tk = toolkit

    def persistent_id(self, obj):
        return "toolkit" if obj is self._tk else None


class _Unpersist(pickle.Unpickler):
    def __init__(self, f, toolkit):
        super().__init__(f)
        self._tk = toolkit

    def persistent_load(self, pid):
        if pid != "toolkit":
            raise pickle.UnpicklingError(f"unknown persistent id {pid!r}")
        return self._tk


def serve(chan: Channel, cfg: dict) -> None:
    """Load the candidate, report its contract surface, then serve calls until 'exit'."""
    import io

    filename = cfg.get("filename", "<memory-program>")
    allowed = frozenset(cfg["allowed_imports"]) | {"__future__"}
    for name in sorted(allowed) + ["_strptime"]:  # pre-import so candidate imports read no files
        try:
            importlib.import_module(name)
        except ImportError:
            pass
    loaded_tops = frozenset(m.partition(".")[0] for m in list(sys.modules))
    module = types.ModuleType(MODULE_NAME)
    module.__file__ = filename
    module.__dict__["__builtins__"] = make_builtins(allowed)
    sys.modules[MODULE_NAME] = module
    source = cfg["source"]
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    toolkit = Toolkit(ParentHost(chan), llm_budget=cfg["llm_budget"], embed_budget=cfg["embed_budget"],
                      **cfg["toolkit_limits"])
    dirs, files = confine.grant_paths(allowed, project_root(), cfg.get("protect", ()))
    if cfg.get("lifeline") is not None:
        confine.start_reaper(int(cfg["lifeline"]), cfg["scratch"])
        os.close(int(cfg["lifeline"]))
    if cfg.get("confine"):
        try:
            confine.confine_self(cfg["scratch"], dirs, files)
        except OSError as e:
            chan.send({"type": "result", "ok": False, "kind": "unconfined", "message": str(e)})
            os._exit(3)
    sys.modules.pop("ctypes", None)
    try:  # compiled before the hook: its source passed the static check; what it compiles later is scanned
        code = compile(source, filename, "exec")
    except SyntaxError as e:
        code = e
    sys.addaudithook(make_audit_hook(cfg["scratch"], tuple(dirs) + tuple(files), allowed | loaded_tops, MODULE_NAME,
                                     filename))
    instance = None

    def run(stage: str, fn):
        t0, c0 = time.perf_counter(), time.process_time()
        try:
            value = fn()
        except BaseException as e:  # noqa: BLE001 - every candidate failure becomes a reply
            chan.send(_error("raised", e, filename))
            return
        c1 = time.process_time()  # CLOCK_PROCESS_CPUTIME_ID: every thread of the process
        stats = {"cpu_s": c1 - c0, "cpu_total": c1, "wall_s": time.perf_counter() - t0}
        if _violations:
            chan.send({"type": "result", "ok": False, "kind": "violation", "message": _violations[0], **stats})
            return
        try:
            chan.send({"type": "result", "ok": True, "value": value, **stats})
        except OverflowError as e:
            chan.send({"type": "result", "ok": False, "kind": "oversized", "message": f"{stage} result: {e}",
                       "cpu_total": c1})
        except (TypeError, ValueError) as e:
            chan.send({"type": "result", "ok": False, "kind": "bad_result", "cpu_total": c1,
                       "message": f"{stage} returned a non-JSON value of type {type(value).__name__}: {e}"})

    def load():
        if isinstance(code, SyntaxError):
            raise code
        exec(code, module.__dict__)  # noqa: S102 - the sandboxed candidate
        return describe_module(module)

    run("load", load)
    while True:
        msg = chan.recv()
        op = msg.get("op")
        if op == "exit":
            os._exit(0)
        if op == "construct":
            def construct():
                nonlocal instance
                instance = module.Memory(toolkit)
            run("construct", construct)
        elif op == "index":
            try:
                units = [module.MemoryUnit(**u) for u in msg["units"]]
            except BaseException as e:  # noqa: BLE001
                chan.send(_error("bad_request", e, filename))
                continue
            run("index", lambda: instance.index(units, msg["session"]))
        elif op == "retrieve":
            try:
                query = module.Query(**msg["query"])
            except BaseException as e:  # noqa: BLE001
                chan.send(_error("bad_request", e, filename))
                continue
            run("retrieve", lambda: instance.retrieve(query))
        elif op == "snapshot":
            def snapshot():
                buf = io.BytesIO()
                _Persist(buf, toolkit).dump(instance)
                return base64.b64encode(buf.getvalue()).decode("ascii")
            run("snapshot", snapshot)
        elif op == "restore":
            def restore():
                nonlocal instance
                instance = _Unpersist(io.BytesIO(base64.b64decode(msg["blob"])), toolkit).load()
            run("restore", restore)
        else:
            chan.send({"type": "result", "ok": False, "kind": "bad_request", "message": f"unknown op {op!r}"})


def main() -> None:
    """Entry point: die with the parent (argv: root, parent pid, "1" = spawned from the parent's
    main thread so PDEATHSIG applies), move the protocol off fds 0/1, read the load message, serve."""
    root, parent_pid, pdeath = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
    if pdeath:
        confine.die_with_parent(parent_pid)
    if root in sys.path:
        sys.path.remove(root)
    out_fd, in_fd = os.dup(1), os.dup(0)
    os.dup2(2, 1)
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    os.close(null)
    sys.stdout = sys.stderr
    sys.stdin = None
    chan = Channel(in_fd, out_fd, 1 << 30)
    cfg = chan.recv()
    chan.max_bytes = int(cfg["max_message_bytes"])
    serve(chan, cfg)


if __name__ == "__main__":
    main()
