"""The subprocess sandbox: hostile programs fail with typed errors and never hurt the parent."""
from __future__ import annotations

import hashlib
import re

import numpy as np
import pytest

from memgym.evolution.execution.sandbox import (DEFAULT_ALLOWED_IMPORTS, ProgramRaised, SandboxLimits, SandboxedProgram,
                                         static_check)
from memgym.memory_bank.programs import read_program_source, reference_program_path, seed_program_path
from tests.helpers import sandbox_fails

SEED = read_program_source(seed_program_path())
#: Limits of the cases that must pass: generous, so a loaded machine never turns them into timeouts.
GENEROUS = SandboxLimits(call_timeout_s=120.0, load_timeout_s=120.0, memory_mb=1024)
#: Tight limits, only for the cases that expect a timeout.
TIGHT = SandboxLimits(call_timeout_s=1.5, load_timeout_s=10.0, memory_mb=1024)
SESSION = {"index": 1, "id": "s1", "date": "2023-05-08T13:56:00", "date_text": "1:56 pm on 8 May, 2023"}


class HashHost:
    """Deterministic test embedder (hashed bag of words, 16 dims) and a scripted llm."""

    def __init__(self):
        self.embedded, self.prompts = [], []

    def embed(self, texts):
        self.embedded.extend(texts)
        out = np.zeros((len(texts), 16), np.float32)
        for i, t in enumerate(texts):
            for w in re.findall(r"\w+", t.lower()) or ["<empty>"]:
                out[i, int(hashlib.md5(w.encode()).hexdigest(), 16) % 16] += 1
        return out / np.linalg.norm(out, axis=1, keepdims=True)

    def llm(self, prompt, max_tokens):
        self.prompts.append(prompt)
        return f"summary of {len(prompt)} chars"


def with_retrieve(body: str, header: str = "") -> str:
    """The seed program with ``body`` (4-space-indented lines) run at the start of retrieve."""
    indented = "\n".join("        " + line for line in body.strip("\n").splitlines())
    return header + SEED.replace("    def retrieve(self, query):", "    def retrieve(self, query):\n" + indented, 1)


def run_retrieve(source: str, *, allowed=DEFAULT_ALLOWED_IMPORTS, limits=GENEROUS, host=None):
    with SandboxedProgram(source, host, limits, allowed_imports=allowed, skip_static_check=True) as p:
        p.index([{"content": "Caroline went hiking"}], SESSION)
        return p.retrieve({"question": "q"})


# ------------------------------------------------------------------ happy path


def test_seed_runs_and_state_persists_between_calls():
    with SandboxedProgram(SEED, HashHost(), GENEROUS) as p:
        assert p.report["missing"] == [] and [f.name for f in p.info.query_fields] == ["question"]
        assert p.index([{"content": "a", "date": "2023-01-01"}, {"content": "b"}], SESSION) is None
        assert p.index([], SESSION) is None
        assert p.retrieve({"question": "q"}) == "[2023-01-01] a\n[2023-05-08] b"
        p.construct()  # a fresh Memory instance
        assert p.retrieve({"question": "q"}) == ""
        assert p.stats["calls"] == 7  # load, construct, index, index, retrieve, construct, retrieve
    assert not p.alive


def test_toolkit_calls_are_proxied_counted_and_budgeted():
    src = with_retrieve("""
first = self.toolkit.llm("summarise: " + query.question, max_tokens=16)
try:
    self.toolkit.llm("again")
except Exception as e:
    return first + " | " + type(e).__name__ + " | budget " + str(self.toolkit.budget)
""")
    host = HashHost()
    with SandboxedProgram(src, host, GENEROUS, llm_budget=1, embed_budget=5) as p:
        assert p.retrieve({"question": "where?"}) == "summary of 17 chars | BudgetExceededError | budget 0"
        assert p.toolkit_calls == {"llm": 1, "embed": 0, "embed_texts": 0, "refused": 0}
    assert host.prompts == ["summarise: where?"]


def test_reference_program_embeds_through_the_parent_and_snapshot_restores():
    src = read_program_source(reference_program_path())
    host = HashHost()
    with SandboxedProgram(src, host, GENEROUS, embed_budget=10) as p:
        p.index([{"content": "Caroline went hiking"}, {"content": "Melanie paints"}], SESSION)
        assert p.retrieve({"search_text": "Melanie paints"}) == \
            "[2023-05-08] Caroline went hiking\n[2023-05-08] Melanie paints"
        blob = p.snapshot()
        assert p.toolkit_calls["embed"] == 2 and p.toolkit_calls["embed_texts"] == 3
    assert host.embedded == ["[2023-05-08] Caroline went hiking", "[2023-05-08] Melanie paints", "Melanie paints"]
    with SandboxedProgram(src, host, GENEROUS, embed_budget=10) as q:
        q.restore(blob)  # no re-indexing: the vectors come from the snapshot
        assert q.retrieve({"search_text": "hiking"}).count("\n") == 1
        assert q.toolkit_calls["embed"] == 1


def test_candidate_prints_do_not_corrupt_the_protocol():
    src = with_retrieve('print("{\\"type\\": \\"result\\", \\"ok\\": true, \\"value\\": \\"forged\\"}")\nprint("x" * 5000)')
    with SandboxedProgram(src, None, GENEROUS) as p:
        assert p.retrieve({"question": "q"}) == ""
        assert '"forged"' in p.stderr_tail and p.stderr_bytes > 5000


# ------------------------------------------------------------------ failures that keep the child alive


def test_program_exception_is_reported_and_child_survives():
    src = with_retrieve("if query.question == 'boom':\n    raise KeyError('boom')")
    with SandboxedProgram(src, None, GENEROUS) as p:
        with pytest.raises(ProgramRaised) as ei:
            p.retrieve({"question": "boom"})
        assert ei.value.exc_type == "KeyError" and ei.value.stage == "retrieve" and "line" in ei.value.detail
        assert p.alive and p.retrieve({"question": "fine"}) == ""


def test_bad_arguments_and_non_json_results():
    with SandboxedProgram(with_retrieve("if query.question == 'set':\n    return {1, 2}"), None, GENEROUS) as p:
        with sandbox_fails("bad_request") as ei:
            p.index([{"content": "a", "colour": "red"}], SESSION)
        assert ei.value.kind == "bad_request" and "colour" in ei.value.reason
        with sandbox_fails("bad_result", match="non-JSON value of type set"):
            p.retrieve({"question": "set"})
        assert p.alive


# ------------------------------------------------------------------ hostile programs


def test_static_check_flags_imports_and_escapes():
    problems = static_check("import os\nfrom subprocess import run\nfrom . import x\nimport numpy.linalg\n"
                            "y = ().__class__.__base__.__subclasses__()\nz = eval('1')\nimport typing\nt = typing.sys\n"
                            "w = getattr(object, '__globals__')\n")
    assert problems == ["line 1: import of 'os' is not allowed", "line 2: import from 'subprocess' is not allowed",
                        "line 3: relative import is not allowed", "line 5: access to attribute '__subclasses__' is "
                        "not allowed", "line 5: access to attribute '__base__' is not allowed",
                        "line 6: use of 'eval' is not allowed", "line 8: access to attribute 'sys' is not allowed",
                        "line 9: string '__globals__' names a forbidden attribute"]
    assert static_check("") == ["source is empty"]
    assert static_check("def f(:\n") == ["line 1: syntax error: invalid syntax"]
    with sandbox_fails("violation", match="import of 'ctypes' is not allowed"):
        SandboxedProgram("import ctypes\n" + SEED)


def test_runtime_import_hook_refuses_disallowed_modules():
    src = with_retrieve("import os")
    with SandboxedProgram(src, None, GENEROUS, skip_static_check=True) as p:
        with pytest.raises(ProgramRaised, match="import of 'os' is not allowed"):
            p.retrieve({"question": "q"})


def test_os_system_through_an_escape_is_blocked(tmp_path):
    marker = tmp_path / "pwned"
    # typing.sys is refused by object (test_module_attributes_never_yield_a_forbidden_module); a function's
    # globals (a name the static check refuses, skipped here) still reach os, and the audit hook stops the call
    src = with_retrieve(f"import typing\ntyping.get_type_hints.__globals__['sys'].modules['os'].system('touch {marker}')"
                        "\nreturn 'ran'")
    with sandbox_fails("violation", match="forbidden operation: os.system"):
        run_retrieve(src)
    assert not marker.exists()


def test_deleting_a_file_is_blocked_even_if_the_violation_is_caught(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me")
    src = with_retrieve(f"""
import typing
try:
    typing.get_type_hints.__globals__['sys'].modules['os'].remove({str(victim)!r})
except BaseException:
    pass
return 'pretending all is well'
""")
    with sandbox_fails("violation", match="file mutation outside the scratch dir: os.remove"):
        run_retrieve(src)
    assert victim.read_text() == "keep me"


def test_writes_outside_scratch_and_reads_of_data_are_blocked_scratch_is_fine(tmp_path):
    target = tmp_path / "evil.txt"
    with sandbox_fails("violation", match="write outside the scratch dir"):
        run_retrieve(with_retrieve(f"open({str(target)!r}, 'w').write('x')"))
    assert not target.exists()
    readme = tmp_path / "secret.txt"
    readme.write_text("answers")
    with sandbox_fails("violation", match="read outside the allowed roots"):
        run_retrieve(with_retrieve(f"return open({str(readme)!r}).read()"))
    assert run_retrieve(with_retrieve("open('notes.txt', 'w').write('ok')\nreturn open('notes.txt').read()")) == "ok"


def test_sockets_subprocess_and_ctypes_are_blocked_even_when_importable():
    extra = DEFAULT_ALLOWED_IMPORTS | {"socket", "subprocess", "ctypes"}
    with sandbox_fails("violation", match="forbidden operation: socket"):
        run_retrieve(with_retrieve("socket.socket().connect(('127.0.0.1', 9))", "import socket\n"), allowed=extra)
    with sandbox_fails("violation", match="forbidden operation: subprocess.Popen"):
        run_retrieve(with_retrieve("subprocess.run(['true'])", "import subprocess\n"), allowed=extra)
    with sandbox_fails("violation", match="forbidden operation: ctypes"):
        run_retrieve(with_retrieve("ctypes.CDLL(None).system(b'true')", "import ctypes\n"), allowed=extra)


def test_infinite_loops_time_out_and_the_child_is_killed():
    with SandboxedProgram(with_retrieve("while True:\n    pass"), None, TIGHT) as p:
        with sandbox_fails("timeout", match="no reply within 1.5 s") as ei:
            p.retrieve({"question": "q"})
        assert ei.value.stage == "retrieve" and not p.alive
        with sandbox_fails("closed"):
            p.retrieve({"question": "q"})
    with sandbox_fails("timeout") as ei:
        SandboxedProgram(SEED + "\nwhile True:\n    pass\n", None, SandboxLimits(load_timeout_s=1.5))
    assert ei.value.stage == "load"


def test_memory_bombs_hit_the_memory_limit():
    with sandbox_fails("memory", match="memory limit exceeded"):
        run_retrieve(with_retrieve("x = bytearray(8 * 10**9)"))
    with sandbox_fails("memory"):
        run_retrieve(with_retrieve("parts = []\nwhile True:\n    parts.append('x' * 10**7)"),
                     limits=SandboxLimits(call_timeout_s=120, memory_mb=512))


def test_oversized_replies_are_refused():
    small = SandboxLimits(call_timeout_s=120, max_message_bytes=100_000)
    with sandbox_fails("oversized", match="exceeds the 100000-byte cap"):
        run_retrieve(with_retrieve("return 'a' * 200_000"), limits=small)


# ------------------------------------------------------------------ denied by object, not by name


def run_checked(source: str):
    """``run_retrieve`` with the static check on, as the runner and validation run programs."""
    with SandboxedProgram(source, None, GENEROUS) as p:
        p.index([{"content": "Caroline went hiking"}], SESSION)
        return p.retrieve({"question": "q"})


@pytest.mark.parametrize("body, message", [
    # the attack: numpy's test helper module holds os and sys
    ("t = getattr(np, '_pytest' + 'tester')\nreturn str(getattr(t, 'o' + 's').stat('/'))",
     "numpy._pytesttester.os is the module 'os', outside the allowed imports"),
    ("return str(getattr(np, '_pytest' + 'tester').__dict__.get('sys'))", None),
    ("import dataclasses\nreturn str(dataclasses._thread.start_new_thread(print, ()))",
     "dataclasses._thread is the module '_thread', outside the allowed imports"),
    ("return str(getattr(np.load, '__glo' + 'bals__')['os'])", "getattr(..., '__globals__') is not allowed"),
    ("import operator\nreturn str(operator.attrgetter('__glo' + 'bals__')(np.load))",
     "operator.attrgetter('__globals__') is not allowed"),
    ("import string\nreturn str(string.Formatter().get_field('0.__glo' + 'bals__', [np.load], {}))",
     "string.Formatter field('0.__globals__') is not allowed"),
    ("import typing\nclass A:\n    x: '().__class__.__base__.__subclasses__()'\nreturn str(typing.get_type_hints(A))",
     "introspection in code compiled at run time: line 1: '__subclasses__'"),
], ids=["numpy-route", "numpy-dict", "thread", "getattr-globals", "attrgetter", "formatter", "forward-ref"])
def test_module_attributes_never_yield_a_forbidden_module(body, message):
    src = with_retrieve(body, "import numpy as np\n")
    assert static_check(src) == []  # every route passes the static check
    if message is None:
        assert run_checked(src) == "None"  # a view's namespace holds no forbidden module
    else:
        with sandbox_fails("violation", match=re.escape(message)):
            run_checked(src)


def test_the_numpy_route_fails_validation_with_a_clear_reason():
    from memgym.evolution.execution.validate import ValidationLimits, validate_program

    src = with_retrieve("t = getattr(np, '_pytest' + 'tester')\nreturn str(getattr(t, 's' + 'ys')._getframe())",
                        "import numpy as np\n")
    r = validate_program(src, limits=ValidationLimits(sandbox=GENEROUS))
    assert (r.ok, r.level) == (False, 3)
    assert "numpy._pytesttester.sys is the module 'sys', outside the allowed imports" in r.reason


def test_module_routes_the_static_check_names_are_refused_at_run_time_too():
    with sandbox_fails("violation", match="typing.sys is the module 'sys', outside the allowed imports"):
        run_retrieve(with_retrieve("import typing\nreturn str(typing.sys)"))
    # sys reached past the static check (a function's globals): its frames stay closed to the program
    with sandbox_fails("violation", match="frame and code introspection is not allowed: sys._getframe"):
        run_retrieve(with_retrieve("import typing\nreturn str(typing.get_type_hints.__globals__['sys']._getframe())"))


def test_a_thread_left_running_is_charged_its_cpu():
    """A thread (started past the static check) spins 1 CPU-second after ``index`` returned; the
    sandbox's ``cpu_s`` counts it (the process's CPU over every thread), not only the calls' own."""
    import time
    from pathlib import Path

    spin = """
import typing
G = typing.get_type_hints.__globals__
T = G['sys'].modules['time']
def spin():
    end = T.process_time() + 1.0
    while T.process_time() < end:
        pass
    open('spun', 'w').write('done')
G['sys'].modules['_thread'].start_new_thread(spin, ())
"""
    src = SEED.replace("    def index(self, units, session):",
                       "    def index(self, units, session):\n" + "\n".join("        " + ln for ln in spin.strip().splitlines()), 1)
    with SandboxedProgram(src, None, GENEROUS, skip_static_check=True) as p:
        cpu0 = p.stats["cpu_s"]
        p.index([{"content": "a"}], SESSION)
        deadline = time.monotonic() + 120
        while not (Path(p._scratch) / "spun").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (Path(p._scratch) / "spun").exists()
        p.retrieve({"question": "q"})
        assert p.stats["cpu_s"] - cpu0 >= 0.95
