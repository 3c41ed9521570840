"""Kernel confinement of the sandbox child, applied by the child to ITSELF after its imports
and before the candidate's first line, irrevocably:

1. ``prctl(PR_SET_NO_NEW_PRIVS)``.
2. seccomp-BPF (x86_64, aarch64): ``EPERM`` for ``socket``, ``socketpair``, ``ptrace``,
   ``process_vm_readv/writev``, ``bpf``, ``perf_event_open``, ``io_uring_*``, ``userfaultfd``,
   key syscalls, ``unshare``, ``setns`` and every syscall of a foreign ABI.
3. Landlock (Linux >= 5.13; Documentation/userspace-api/landlock.rst): read on the stdlib,
   allow-listed packages, system libraries and the exact imported project files; write on
   the scratch folder only; execute nowhere; ABI >= 4 denies TCP, ABI >= 6 scopes abstract
   UNIX sockets and signals.
4. Death with the parent: ``PR_SET_PDEATHSIG`` plus a reaper on a lifeline pipe that
   SIGKILLs the child and removes the scratch folder.

Without Landlock :func:`resolve` raises unless ``MEMGYM_ALLOW_UNCONFINED_SANDBOX=1``; the mode
string then says ``UNCONFINED``. Not stopped: ``stat``/path walking, reads of the granted
folders, CPU/memory within the rlimits, kernel bugs, and on ABI < 6 signals to same-user processes.
"""
from __future__ import annotations

import ctypes
import os
import platform
import select
import shutil
import signal
import sys
from dataclasses import dataclass
from functools import lru_cache

ALLOW_ENV = "MEMGYM_ALLOW_UNCONFINED_SANDBOX"
"""Environment switch: ``1`` lets programs run unconfined where the kernel offers no Landlock."""

_SYS = {"x86_64": {"create": 444, "add": 445, "restrict": 446},
        "aarch64": {"create": 444, "add": 445, "restrict": 446}}
# seccomp deny list: (audit arch, {name: nr})
_SECCOMP = {
    "x86_64": (0xC000003E, {"socket": 41, "socketpair": 53, "ptrace": 101, "process_vm_readv": 310,
                            "process_vm_writev": 311, "bpf": 321, "perf_event_open": 298, "userfaultfd": 323,
                            "keyctl": 250, "add_key": 248, "request_key": 249, "unshare": 272, "setns": 308,
                            "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}),
    "aarch64": (0xC00000B7, {"socket": 198, "socketpair": 199, "ptrace": 117, "process_vm_readv": 270,
                             "process_vm_writev": 271, "bpf": 280, "perf_event_open": 241, "userfaultfd": 282,
                             "keyctl": 219, "add_key": 217, "request_key": 218, "unshare": 97, "setns": 268,
                             "io_uring_setup": 425, "io_uring_enter": 426, "io_uring_register": 427}),
}
PR_SET_PDEATHSIG, PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 1, 38, 22, 2

# Landlock access rights (include/uapi/linux/landlock.h)
FS_EXECUTE, FS_WRITE_FILE, FS_READ_FILE, FS_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
FS_REMOVE_DIR, FS_REMOVE_FILE, FS_MAKE_CHAR, FS_MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
FS_MAKE_REG, FS_MAKE_SOCK, FS_MAKE_FIFO, FS_MAKE_BLOCK, FS_MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
FS_REFER, FS_TRUNCATE, FS_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
NET_BIND_TCP, NET_CONNECT_TCP = 1 << 0, 1 << 1
SCOPE_ABSTRACT_UNIX_SOCKET, SCOPE_SIGNAL = 1 << 0, 1 << 1
_RULE_PATH_BENEATH, _CREATE_RULESET_VERSION = 1, 1
_FILE_RIGHTS = FS_EXECUTE | FS_WRITE_FILE | FS_READ_FILE | FS_TRUNCATE | FS_IOCTL_DEV


class ConfinementError(OSError):
    """The kernel refused a confinement step (message names the step and errno)."""


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                ("scoped", ctypes.c_uint64)]


class _PathBeneath(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


class _SockFilter(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint16), ("jt", ctypes.c_uint8), ("jf", ctypes.c_uint8), ("k", ctypes.c_uint32)]


class _SockFprog(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(_SockFilter))]


@lru_cache(maxsize=1)
def _libc():
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    libc.prctl.restype = ctypes.c_int
    return libc


def _check(rc: int, what: str) -> int:
    if rc < 0:
        err = ctypes.get_errno()
        raise ConfinementError(err, f"{what} failed: {os.strerror(err)}")
    return rc


@dataclass(frozen=True)
class KernelSupport:
    """What this kernel offers: ``landlock_abi`` (0 = none), ``seccomp`` (filter available
    for this architecture), ``reason`` (why Landlock is missing, "" if present)."""

    landlock_abi: int
    seccomp: bool
    reason: str = ""

    @property
    def label(self) -> str:
        """e.g. ``"kernel: landlock ABI 7 + seccomp"``."""
        parts = [f"landlock ABI {self.landlock_abi}"] + (["seccomp"] if self.seccomp else [])
        return "kernel: " + " + ".join(parts)


@lru_cache(maxsize=1)
def probe() -> KernelSupport:
    """Ask the kernel (``landlock_create_ruleset(NULL, 0, VERSION)``); never raises."""
    machine = platform.machine()
    if sys.platform != "linux" or machine not in _SYS:
        return KernelSupport(0, False, f"Landlock needs Linux on x86_64/aarch64 (this is {sys.platform}/{machine})")
    try:
        libc = _libc()
        abi = libc.syscall(_SYS[machine]["create"], None, ctypes.c_size_t(0), ctypes.c_uint32(_CREATE_RULESET_VERSION))
        err = ctypes.get_errno()
    except (OSError, AttributeError) as e:
        return KernelSupport(0, False, f"cannot call the kernel: {e}")
    if abi < 1:
        return KernelSupport(0, machine in _SECCOMP, f"the kernel refuses Landlock ({os.strerror(err)}; "
                                                     "needs Linux >= 5.13 with lsm=landlock)")
    return KernelSupport(int(abi), machine in _SECCOMP)


@dataclass(frozen=True)
class Mode:
    """How a sandbox will run: ``kernel`` (confine the child) and ``label`` (what reports say)."""

    kernel: bool
    label: str


class UnconfinedRefused(RuntimeError):
    """The kernel offers no Landlock and the unconfined switch is not set."""


def resolve(confinement: str = "auto") -> Mode:
    """The mode for a new sandbox. ``confinement``: ``"auto"`` (kernel confinement; where the
    kernel lacks Landlock raise :class:`UnconfinedRefused` unless ``$MEMGYM_ALLOW_UNCONFINED_SANDBOX=1``)
    or ``"off"`` (explicitly unconfined, for the cost benchmark's baseline)."""
    if confinement == "off":
        return Mode(False, "UNCONFINED (confinement='off': Python-level checks only)")
    if confinement != "auto":
        raise ValueError(f"confinement must be 'auto' or 'off', got {confinement!r}")
    ks = probe()
    if ks.landlock_abi >= 1:
        return Mode(True, ks.label)
    if os.environ.get(ALLOW_ENV) == "1":
        return Mode(False, f"UNCONFINED ({ALLOW_ENV}=1; {ks.reason}): Python-level checks only")
    raise UnconfinedRefused(f"refusing to run an untrusted program: {ks.reason}, so nothing but Python-level checks "
                            f"would stand between it and your files; set {ALLOW_ENV}=1 to run it anyway (every "
                            "report then says UNCONFINED)")


_warned: set[str] = set()


def warn_unconfined(label: str) -> None:
    """Say once per process and mode (a UserWarning) that programs run without kernel confinement."""
    if label not in _warned:
        _warned.add(label)
        import warnings
        warnings.warn(f"memgym sandbox: {label}: untrusted programs are NOT confined by the kernel in this run",
                      stacklevel=3)


def current_label() -> str:
    """The mode label a sandbox started now would carry (never raises; for reports)."""
    try:
        return resolve("auto").label
    except UnconfinedRefused as e:
        return f"refused: {e}"


# ---------------------------------------------------------------------------- child side

def _real(p: str) -> str:
    return os.path.realpath(p)


def _contains(parent: str, child: str) -> bool:
    parent = parent.rstrip(os.sep) or os.sep
    return child == parent or child.startswith(parent if parent.endswith(os.sep) else parent + os.sep)


def protected_paths(project_root: str) -> list[str]:
    """Folders no grant may contain (parent side): the project, the data folder
    (``$MEMGYM_DATA`` or the default), the caches (``$MEMGYM_CACHE``, ``$HF_HOME``) and the
    current folder (where ``runs/`` usually is)."""
    out = [project_root, os.getcwd()]
    try:
        from memgym.data_synth.paths import data_root
        out.append(str(data_root()))
    except Exception:  # noqa: BLE001 - a missing data folder protects nothing
        pass
    out += [os.environ[k] for k in ("MEMGYM_CACHE", "HF_HOME", "MEMGYM_DATA") if os.environ.get(k)]
    return sorted({_real(p) for p in out})


def grant_paths(allowed_modules, project_root: str, protect=()) -> tuple[list[str], list[str]]:
    """(read-only folders, read-only files) for a child that has imported everything it needs:
    the stdlib folder, each loaded allow-listed package's folder and ``<name>.libs``, the system
    library folders, and the exact imported project files. No folder containing
    ``project_root`` or a ``protect`` path (:func:`protected_paths`) is granted.
    """
    root = _real(project_root)
    dirs = {_real(os.path.dirname(os.__file__))}
    for lib in ("/lib", "/lib64", "/usr/lib", "/usr/lib64", "/usr/local/lib"):
        if os.path.isdir(lib):
            dirs.add(_real(lib))
    files = set()
    for name, mod in list(sys.modules.items()):
        path = getattr(mod, "__file__", None)
        if not isinstance(path, str) or not os.path.isabs(path):
            continue
        path = _real(path)
        parts = name.split(".")
        top = parts[0]
        own = parts[1] if top == "memgym" and len(parts) > 1 else top  # memgym.<folder>: the folder under root
        if _contains(os.path.join(root, own), path):  # the project's own modules (memgym.memory_bank.contract, ...)
            files.add(path)
            continue
        if top in allowed_modules and name == top and getattr(mod, "__path__", None):
            pkg = os.path.dirname(path)
            dirs.add(pkg)
            libs = pkg + ".libs"
            if os.path.isdir(libs):
                dirs.add(libs)
    if os.path.exists(os.devnull):
        files.add(os.devnull)
    guarded = [root] + [_real(p) for p in protect]
    dirs = {d for d in dirs if not any(_contains(d, g) for g in guarded)}
    files = {f for f in files if f == os.devnull or _contains(root, f)}
    return sorted(dirs), sorted(files)


def _seccomp_filter() -> None:
    arch, table = _SECCOMP[platform.machine()]
    deny = 0x00050000 | 1  # SECCOMP_RET_ERRNO | EPERM
    allow = 0x7FFF0000
    nrs = sorted(set(table.values()))
    prog = [(0x20, 0, 0, 4),                       # ld [arch]
            (0x15, 1, 0, arch),                    # jeq arch -> +1
            (0x06, 0, 0, deny),                    # foreign ABI: EPERM
            (0x20, 0, 0, 0),                       # ld [nr]
            (0x35, len(nrs) + 1, 0, 0x40000000)]   # jge x32 bit -> deny
    for i, nr in enumerate(nrs):
        prog.append((0x15, len(nrs) - i, 0, nr))  # jeq nr -> deny
    prog += [(0x06, 0, 0, allow), (0x06, 0, 0, deny)]
    arr = (_SockFilter * len(prog))(*[_SockFilter(*p) for p in prog])
    fprog = _SockFprog(len(prog), arr)
    _check(_libc().prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0), "seccomp filter")


def _fs_rights(abi: int) -> int:
    rights = (1 << 13) - 1
    if abi >= 2:
        rights |= FS_REFER
    if abi >= 3:
        rights |= FS_TRUNCATE
    if abi >= 5:
        rights |= FS_IOCTL_DEV
    return rights


def confine_self(scratch: str, read_dirs: list[str], read_files: list[str]) -> str:
    """Apply no_new_privs, the seccomp filter and Landlock to the calling process (irrevocable).
    Returns the label of what was applied; raises :class:`ConfinementError` naming the step."""
    ks = probe()
    if ks.landlock_abi < 1:
        raise ConfinementError(0, f"Landlock unavailable: {ks.reason}")
    libc, nr = _libc(), _SYS[platform.machine()]
    abi = ks.landlock_abi
    handled = _fs_rights(abi)
    attr = _RulesetAttr(handled, (NET_BIND_TCP | NET_CONNECT_TCP) if abi >= 4 else 0,
                        (SCOPE_ABSTRACT_UNIX_SOCKET | SCOPE_SIGNAL) if abi >= 6 else 0)
    size = 8 if abi < 4 else 16 if abi < 6 else 24
    fd = _check(libc.syscall(nr["create"], ctypes.byref(attr), ctypes.c_size_t(size), ctypes.c_uint32(0)),
                "landlock_create_ruleset")
    try:
        write = handled & ~FS_EXECUTE & ~FS_MAKE_CHAR & ~FS_MAKE_BLOCK & ~FS_MAKE_SOCK & ~FS_MAKE_FIFO & ~FS_IOCTL_DEV
        rules = [(p, FS_READ_FILE | FS_READ_DIR) for p in read_dirs] + [(scratch, write)]
        rules += [(p, (FS_READ_FILE | FS_WRITE_FILE) if p == os.devnull else FS_READ_FILE) for p in read_files]
        for path, access in rules:
            try:
                pfd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError as e:
                raise ConfinementError(e.errno, f"cannot open {path} for a Landlock rule: {e.strerror}") from None
            try:
                if not os.path.isdir(path):
                    access &= _FILE_RIGHTS
                rule = _PathBeneath(access & handled, pfd)
                _check(libc.syscall(nr["add"], ctypes.c_int(fd), ctypes.c_int(_RULE_PATH_BENEATH), ctypes.byref(rule),
                                    ctypes.c_uint32(0)), f"landlock_add_rule({path})")
            finally:
                os.close(pfd)
        _check(libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "prctl(PR_SET_NO_NEW_PRIVS)")
        if ks.seccomp:
            _seccomp_filter()
        _check(libc.syscall(nr["restrict"], ctypes.c_int(fd), ctypes.c_uint32(0)), "landlock_restrict_self")
    finally:
        os.close(fd)
    return ks.label


def die_with_parent(parent_pid: int) -> None:
    """``PR_SET_PDEATHSIG = SIGKILL``; exits at once if the parent is already gone (the race
    between fork and prctl)."""
    _check(_libc().prctl(PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0), "prctl(PR_SET_PDEATHSIG)")
    if os.getppid() != parent_pid:
        os._exit(1)


def start_reaper(lifeline_fd: int, scratch: str, poll_s: float = 0.2) -> int:
    """Fork the reaper (call BEFORE :func:`confine_self`): it waits on ``lifeline_fd`` and, on EOF,
    SIGKILLs this process and removes ``scratch``. Returns the reaper's pid.
    """
    me = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    try:  # the reaper: no candidate code ever runs here
        null = os.open(os.devnull, os.O_RDWR)
        for fd in (0, 1, 2):
            os.dup2(null, fd)
        if null > 2:
            os.close(null)
        os.closerange(3, lifeline_fd)
        os.closerange(lifeline_fd + 1, 1 << 16)
        while os.getppid() == me:
            r, _, _ = select.select([lifeline_fd], [], [], poll_s)
            if r:
                if os.getppid() == me:
                    os.kill(me, signal.SIGKILL)
                break
        shutil.rmtree(scratch, ignore_errors=True)
    finally:
        os._exit(0)
