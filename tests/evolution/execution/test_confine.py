"""Issue 19, section 1: the sandbox boundary is the kernel's (Landlock + seccomp), not Python's.

A candidate that switches the Python-level checks off from inside (the traceback-frame
technique) still reads nothing outside what it needs to run; a killed check leaves no child.
"""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from memgym.data_synth.paths import locomo_path
from memgym.evolution.execution import confine
from memgym.evolution.execution.sandbox import SandboxedProgram
from memgym.memory_bank.programs import read_program_source, seed_program_path
from tests.helpers import sandbox_fails

REPO = Path(__file__).resolve().parents[3]
SEED = read_program_source(seed_program_path())
needs_landlock = pytest.mark.skipif(confine.probe().landlock_abi < 1, reason="kernel without Landlock")

# The escape of issue 19: catch the first forbidden open's error, walk its traceback to the
# audit hook's frame, set the hook's re-entrancy flag (so it returns at once forever after) and
# clear the recorded violations. Attribute names are built from pieces so the static check does
# not see them; the real sys and getattr come from a function's globals read through its type's
# descriptor, and the frames from the stdlib's traceback.walk_tb (the program's getattr, module
# views and frame audit refuse the shorter routes, see test_sandbox.py).
DISARM = '''
def _real():
    import typing
    f = typing.get_type_hints
    g = vars(type(f))["__glo" + "bals__"].__get__(f)
    b = g["__buil" + "tins__"]
    return g["s" + "ys"], (b if isinstance(b, dict) else vars(b))["getattr"]


def _disarm():
    sys_mod, rget = _real()
    try:
        open("/proc/self/environ")
    except BaseException as e:
        tb = vars(BaseException)["__trace" + "back__"].__get__(e)
        for fr, _ in sys_mod.modules["trace" + "back"].walk_tb(tb):
            loc = rget(fr, "f_" + "locals")
            if "busy" in loc:
                loc["busy"][0] = True
            found = rget(fr, "f_" + "globals").get("_viol" + "ations")
            if isinstance(found, list):
                found.clear()
'''

CHEAT = SEED.replace("class Memory:", DISARM + '''

def _gold(path):
    _disarm()
    try:
        with open(path) as f:
            data = json.load(f)
    except Exception:
        return {}
    return {q["question"]: str(q.get("answer", "")) for conv in data for q in conv["qa"]}


class Memory:''').replace("from dataclasses import dataclass", "import json\nfrom dataclasses import dataclass").replace(
    '''    def retrieve(self, query):
        return "\\n".join(self.lines)[:OUT_CHAR_BUDGET]''',
    '''    def retrieve(self, query):
        if not hasattr(self, "gold"):
            self.gold = _gold(DATA)
        text = "\\n".join(self.lines)
        if query.question in self.gold:
            text = self.gold[query.question] + "\\n" + text
        return text[:OUT_CHAR_BUDGET]''')


def _probe_program(targets: dict) -> str:
    """A program whose retrieve disarms the hook, then tries each target and reports what it got."""
    return SEED.replace("class Memory:", DISARM + f'''

TARGETS = {targets!r}


def _attempt(kind, path):
    sys_mod, _ = _real()
    os_mod = sys_mod.modules["o" + "s"]
    try:
        if kind == "read":
            with open(path, "rb") as f:
                return "GOT " + repr(f.read(40))
        if kind == "list":
            return "GOT " + repr(sorted(os_mod.listdir(path))[:5])
        if kind == "write":
            with open(path, "w") as f:
                f.write("x")
            return "GOT wrote"
        if kind == "socket":
            sock = sys_mod.modules["importlib"].import_module("socket")
            s = getattr(sock, "sock" + "et")(sock.AF_INET, sock.SOCK_DGRAM)
            return "GOT socket " + repr(s.fileno())
        if kind == "unix":
            sock = sys_mod.modules["importlib"].import_module("socket")
            s = getattr(sock, "sock" + "et")(sock.AF_UNIX, sock.SOCK_STREAM)
            return "GOT socket " + repr(s.fileno())
    except BaseException as e:
        return type(e).__name__


class Memory:''').replace('''    def retrieve(self, query):
        return "\\n".join(self.lines)[:OUT_CHAR_BUDGET]''', '''    def retrieve(self, query):
        _disarm()
        out = {}
        for key in sorted(TARGETS):
            kind, path = TARGETS[key]
            out[key] = _attempt(kind, path)
        return out''')


def _targets(tmp_path: Path) -> dict:
    secret = tmp_path / "secret.txt"
    secret.write_text("the gold answer")
    return {"data": ("read", str(locomo_path())), "pyproject": ("read", str(REPO / "pyproject.toml")),
            "list_repo": ("list", str(REPO)), "list_data": ("list", str(locomo_path().parent)),
            "secret": ("read", str(secret)), "write_outside": ("write", str(tmp_path / "planted.txt")),
            "proc_parent": ("read", f"/proc/{os.getpid()}/cmdline"), "udp": ("socket", ""), "unix": ("unix", "")}


def _run(source: str, **kw):
    with SandboxedProgram(source, **kw) as sb:
        sb.index([{"content": "x"}], {"date": "2023-05-08"})
        return sb.retrieve({"question": "q"}), sb.confinement


def test_the_escape_works_without_the_kernel_boundary(tmp_path):
    """Proof that the technique really defeats the Python-level checks (the state before the fix)."""
    out, label = _run(_probe_program(_targets(tmp_path)), confinement="off")
    assert label.startswith("UNCONFINED")
    assert out["data"].startswith("GOT b'[") and out["secret"] == "GOT b'the gold answer'"
    assert out["pyproject"].startswith("GOT b'[build-system]") and out["list_repo"].startswith("GOT [")
    assert out["udp"].startswith("GOT socket") and (tmp_path / "planted.txt").exists()


@needs_landlock
def test_a_disarmed_program_reads_lists_writes_and_connects_nothing(tmp_path):
    out, label = _run(_probe_program(_targets(tmp_path)))
    assert label == confine.probe().label and label.startswith("kernel: landlock ABI")
    assert out == {"data": "PermissionError", "pyproject": "PermissionError", "list_repo": "PermissionError",
                   "list_data": "PermissionError", "secret": "PermissionError", "write_outside": "PermissionError",
                   "proc_parent": "PermissionError", "udp": "PermissionError", "unix": "PermissionError"}
    assert not (tmp_path / "planted.txt").exists()


def test_the_python_filter_names_project_reads(tmp_path):
    """Without the escape, the first filter refuses a read of the project with a clear message
    (the import path no longer counts as readable)."""
    src = SEED.replace('''        return "\\n".join(self.lines)[:OUT_CHAR_BUDGET]''',
                       f'''        return open({str(REPO / "pyproject.toml")!r}).read()''')
    with sandbox_fails("violation", match=r"read outside the allowed roots: open\('.*pyproject.toml'\)"):
        _run(src)


def test_granted_paths_hold_nothing_of_the_project():
    code = ("import sys; sys.path.insert(0, sys.argv[1]); import numpy, json; import memgym.memory_bank.contract; "
            "from memgym.evolution.execution.confine import grant_paths; import json as j; "
            "print(j.dumps([grant_paths({'numpy', 'json'}, sys.argv[1]), "
            "grant_paths({'numpy', 'json'}, sys.argv[1], ['/usr/lib/some-data-folder'])]))")
    (dirs, files), (dirs2, files2) = json.loads(subprocess.run([sys.executable, "-I", "-c", code, str(REPO)],
                                                               capture_output=True, text=True, check=True).stdout)
    root = str(REPO.resolve())
    assert not [d for d in dirs if root == d or root.startswith(d + os.sep)]  # no ancestor of the project
    inside = [d for d in dirs if d.startswith(root + os.sep)]
    assert all(os.path.basename(d) in ("numpy", "numpy.libs") for d in inside)  # the venv's numpy, nothing else
    project_files = [f for f in files if f.startswith(root + os.sep)]
    assert project_files and all(f.endswith(".py") for f in project_files)
    assert str(REPO / "memory_bank" / "contract" / "toolkit.py") in project_files
    assert not [p for p in dirs + files if str(locomo_path().parent) in p]
    assert "/usr/lib" in dirs
    # a protected (data) folder under a system folder: that system folder is not granted
    assert "/usr/lib" not in dirs2 and set(dirs2) == set(dirs) - {"/usr/lib"} and files2 == files
    assert str(REPO.resolve()) in confine.protected_paths(str(REPO)) and str(locomo_path().parent.parent) in \
        confine.protected_paths(str(REPO))


def test_no_landlock_refuses_unless_the_switch_is_set(monkeypatch):
    monkeypatch.setattr(confine, "probe", lambda: confine.KernelSupport(0, False, "the kernel refuses Landlock"))
    monkeypatch.delenv(confine.ALLOW_ENV, raising=False)
    with sandbox_fails("unconfined", match="refusing to run an untrusted program: the kernel refuses Landlock.*"
                                                "MEMGYM_ALLOW_UNCONFINED_SANDBOX=1"):
        SandboxedProgram(SEED)
    monkeypatch.setenv(confine.ALLOW_ENV, "1")
    with SandboxedProgram(SEED) as sb:
        assert sb.confinement == ("UNCONFINED (MEMGYM_ALLOW_UNCONFINED_SANDBOX=1; the kernel refuses Landlock): "
                                  "Python-level checks only")
        assert sb.retrieve({"question": "q"}) == ""


def _eval_overall(tmp_path: Path, source: str, name: str) -> float:
    from memgym.launch.cli import main as memgym

    prog = tmp_path / f"{name}.py"
    prog.write_text(source.replace("DATA)", f"{str(locomo_path())!r})"))
    out = tmp_path / name
    rc = memgym(["program", "eval", str(prog), "--conversations", "conv-26", "--n_sessions", "3", "--extractor", "turns",
                 "--plan_mode", "question", "--scorer", "answer-recall", "--no_diagnostics", "--no_validate",
                 "--stage_cache", "none", "--cache", str(tmp_path / f"{name}.sqlite"), "--no_progress",
                 "--out", str(out)])
    assert rc == 0
    return json.loads((out / "report.json").read_text())["overall"]


@needs_landlock
def test_the_escape_gains_nothing_in_program_eval(tmp_path, monkeypatch):
    """conv-26, 3 sessions, turns, answer-recall: the seed scores 0.659 (25 questions); the
    cheating program 0.950 unconfined (the issue's figure) and exactly the seed's confined."""
    seed = _eval_overall(tmp_path, SEED, "seed")
    assert seed == pytest.approx(0.659, abs=5e-4)
    assert _eval_overall(tmp_path, CHEAT, "cheat") == seed
    monkeypatch.setattr(confine, "probe", lambda: confine.KernelSupport(0, False, "simulated"))
    monkeypatch.setenv(confine.ALLOW_ENV, "1")
    assert _eval_overall(tmp_path, CHEAT, "cheat_unconfined") == pytest.approx(0.950, abs=5e-4)


_HANG = """
import sys, threading
sys.path.insert(0, sys.argv[1])
from memgym.evolution.execution.sandbox import SandboxedProgram, SandboxLimits

def spin():
    sb = SandboxedProgram(open(sys.argv[2]).read(), limits=SandboxLimits(call_timeout_s=600))
    print(sb._proc.pid, sb._scratch, flush=True)
    sb.retrieve({"question": "q"})

if sys.argv[3] == "main":
    spin()
else:  # a worker thread: PDEATHSIG would follow the thread, so only the reaper acts
    t = threading.Thread(target=spin)
    t.start()
    t.join()
"""
SPIN = SEED.replace('''        return "\\n".join(self.lines)[:OUT_CHAR_BUDGET]''', "        while True:\n            pass")


def _gone(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return True
    return state in ("Z", "X")  # a zombie runs nothing (PID 1 of a container may not reap it)


@needs_landlock
@pytest.mark.parametrize("where", ["main", "thread"])
def test_kill9_of_the_check_leaves_no_child_and_no_scratch(tmp_path, where):
    script, prog = tmp_path / "hang.py", tmp_path / "spin.py"
    script.write_text(_HANG)
    assert SPIN != SEED
    prog.write_text(SPIN)
    p = subprocess.Popen([sys.executable, str(script), str(REPO), str(prog), where], stdout=subprocess.PIPE,
                         text=True, start_new_session=True)
    pid_s, scratch = p.stdout.readline().split()
    child = int(pid_s)
    time.sleep(0.3)  # the child is now spinning in retrieve
    assert not _gone(child) and os.path.isdir(scratch)
    os.killpg(p.pid, signal.SIGKILL)
    p.wait()
    deadline = time.monotonic() + 1.0
    while not _gone(child) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert _gone(child)
    deadline = time.monotonic() + 5.0
    while os.path.isdir(scratch) and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not os.path.isdir(scratch)


def test_an_unconfined_run_is_named_in_every_verdict(monkeypatch):
    from memgym.evolution.execution.validate import ValidationLimits, validate_program

    ok = validate_program(SEED, None, ValidationLimits(run_probe=False))
    if confine.probe().landlock_abi >= 1:
        assert ok.ok and ok.stats["sandbox"] == confine.probe().label and "sandbox" not in ok.to_dict()
    monkeypatch.setattr(confine, "probe", lambda: confine.KernelSupport(0, False, "no Landlock here"))
    monkeypatch.delenv(confine.ALLOW_ENV, raising=False)
    refused = validate_program(SEED, None, ValidationLimits(run_probe=False))
    assert not refused.ok and refused.level == 1 and refused.reason.startswith(
        "module failed to load: load unconfined: refusing to run an untrusted program: no Landlock here")
    monkeypatch.setenv(confine.ALLOW_ENV, "1")
    monkeypatch.setattr(confine, "_warned", set())
    with pytest.warns(UserWarning, match="memgym sandbox: UNCONFINED .*NOT confined by the kernel"):
        res = validate_program(SEED, None, ValidationLimits(run_probe=False))
    assert res.ok and res.to_dict() == {"ok": True, "level": None, "reason": "", "sandbox": (
        "UNCONFINED (MEMGYM_ALLOW_UNCONFINED_SANDBOX=1; no Landlock here): Python-level checks only")}
