"""Four-level validation and ``memgym program check``."""
from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from memgym.evolution.execution.sandbox import SandboxLimits
from memgym.evolution.execution.validate import StubHost, ValidationLimits, normalised_ast, synthetic_record, validate_program
from memgym.memory_bank.contract import FieldSpec
from memgym.memory_bank.programs import read_program_source, reference_program_path, seed_program_path

SEED = read_program_source(seed_program_path())
REFERENCE = read_program_source(reference_program_path())
#: Limits of the cases that must pass: generous, so a loaded machine never turns them into timeouts.
GENEROUS = ValidationLimits(sandbox=SandboxLimits(call_timeout_s=120.0, load_timeout_s=120.0, memory_mb=1024))
#: Tight limits, only for the cases that expect a timeout.
TIGHT = ValidationLimits(sandbox=SandboxLimits(call_timeout_s=1.5, load_timeout_s=4.0, memory_mb=1024))


def patch_method(source: str, method: str, body: str) -> str:
    """``source`` with ``body`` (lines, 8-space-indented here) inserted at the start of ``method``."""
    head = f"    def {method}(self, " + ("units, session):" if method == "index" else "query):")
    indented = "\n".join("        " + line for line in body.strip("\n").splitlines())
    assert head in source
    return source.replace(head, head + "\n" + indented, 1)


# ------------------------------------------------------------------ passing programs


@pytest.mark.parametrize("source", [SEED, REFERENCE], ids=["seed", "reference"])
def test_builtin_programs_pass_all_four_levels(source):
    r = validate_program(source, limits=GENEROUS)
    assert (r.ok, r.level, r.reason) == (True, None, "")
    assert r.stats["levels_passed"] == [1, 2, 3, 4]
    assert r.stats["probe_units"] == 2000 and r.stats["probe_llm_calls"] == 0
    assert 0 < r.stats["probe_retrieve_chars"] <= 16_000
    # the seed never embeds; the reference embeds once per index batch and once per query
    assert r.stats["probe_embed_calls"] == (0 if source is SEED else 100 + 2)


def test_a_real_patch_passes_and_a_cosmetic_one_fails_level_1():
    cosmetic = SEED.replace('"""PrisMem seed memory program', '# a new comment\n"""A reworded docstring', 1)
    cosmetic = cosmetic.replace("self.lines = []", "self.lines = [ ]   # spacing")
    r = validate_program(cosmetic, parent_source=SEED, limits=GENEROUS)
    assert (r.ok, r.level) == (False, 1) and "no real change" in r.reason
    real = SEED.replace('return "\\n".join(self.lines)', 'return "\\n".join(reversed(self.lines))')
    assert real != SEED
    assert validate_program(real, parent_source=SEED, limits=GENEROUS).ok


def test_normalised_ast_ignores_docstrings_and_formatting_only():
    assert normalised_ast('"""doc"""\nx = ( 1 )  # c\n') == normalised_ast("x = 1\n")
    assert normalised_ast("x = 1\n") != normalised_ast("x = 2\n")
    assert normalised_ast('A = "text"\n') != normalised_ast('A = "other"\n')  # instruction edits count


# ------------------------------------------------------------------ failing levels


@pytest.mark.parametrize("source,level,fragment", [
    ("", 1, "source is empty"),
    ("def broken(:\n", 1, "syntax error"),
    (SEED.replace("class Memory:", "class Memo:"), 1, "does not define Memory"),
    (SEED + "\nraise RuntimeError('load failure')\n", 1, "module failed to load: load raised: RuntimeError"),
    (SEED.replace("    question: str", "    question: dict"), 2, "Query.question: unsupported type"),
    (SEED.replace('ANSWER_INSTRUCTION = (', 'ANSWER_INSTRUCTION = "" and ('), 2, "ANSWER_INSTRUCTION must be a non-empty"),
    (SEED.replace("    def retrieve(self, query):", "    async def retrieve(self, query):"), 2, "synchronous"),
    (SEED.replace("    def index(self, units, session):", "    def index(self, units):"), 2, "index must accept"),
    (SEED.replace("@dataclass\nclass Query:", "class Query:"), 2, "Query must be a dataclass"),
    (patch_method(SEED, "index", "return len(units)"), 3, "index must return None, returned int"),
    (patch_method(SEED, "retrieve", "return 'x' * 16_001"), 3, "16001 characters > OUT_CHAR_BUDGET 16000"),
    (patch_method(SEED, "retrieve", "return ['not', 'a', 'str']"), 3, "retrieve must return str, returned list"),
    (patch_method(SEED, "index", "if not units:\n    raise ValueError('empty')"), 3, "ValueError: empty"),
    (patch_method(SEED, "retrieve", "if len(self.lines) > 100:\n    return 'x' * 20_000"), 4, "probe query 1"),
])
def test_failing_level_and_reason(source, level, fragment):
    r = validate_program(source, limits=GENEROUS)
    assert (r.ok, r.level) == (False, level), r.reason
    assert fragment in r.reason


def test_probe_caps_backend_calls_and_cpu():
    per_unit = patch_method(REFERENCE, "index", "for u in units:\n    self.toolkit.embed([u.content])")
    r = validate_program(per_unit, limits=GENEROUS)
    assert (r.ok, r.level) == (False, 4)
    # one embed call per unit: the ~2K-unit probe runs out of the embed budget inside index
    assert r.reason == "index raised: BudgetExceededError: embed call budget exhausted"
    chatty = patch_method(SEED, "index", "self.toolkit.llm('summarise ' + str(len(units)))\nself.toolkit.llm('again')")
    r = validate_program(chatty, limits=GENEROUS)
    assert (r.ok, r.level) == (False, 4) and "BudgetExceededError" in r.reason
    burner = patch_method(SEED, "index", "total = 0\nfor i in range(300_000):\n    total += i * i")
    tight = ValidationLimits(sandbox=GENEROUS.sandbox, probe_cpu_s=0.5)
    r = validate_program(burner, limits=tight)
    assert (r.ok, r.level) == (False, 4) and "CPU > budget 0.5 s" in r.reason
    assert validate_program(burner, limits=ValidationLimits(sandbox=GENEROUS.sandbox, run_probe=False)).ok


# ------------------------------------------------------------------ hostile sources


def hostile_sources(victim: str) -> dict[str, tuple[str, int, str]]:
    return {
        "infinite loop in index": (patch_method(SEED, "index", "while True:\n    pass"), 3, "timeout"),
        "infinite loop at import": (SEED + "\nwhile True:\n    pass\n", 1, "timeout"),
        "os.system": ("import os\n" + patch_method(SEED, "index", "os.system('echo hi')"), 1, "import of 'os'"),
        "socket": ("import socket\n" + SEED, 1, "import of 'socket'"),
        "memory bomb": (patch_method(SEED, "retrieve", "x = bytearray(8 * 10**9)"), 3, "memory limit exceeded"),
        "import ctypes": ("import ctypes\n" + SEED, 1, "import of 'ctypes'"),
        "delete a file": ("import os\n" + patch_method(SEED, "index", f"os.remove({victim!r})"), 1, "import of 'os'"),
        "delete via an escape": (
            "import typing\n" + patch_method(SEED, "index", f"getattr(typing, 's' + 'ys').modules['os'].remove({victim!r})"),
            3, "typing.sys is the module 'sys', outside the allowed imports"),
        "delete via a descriptor escape": (
            "import typing\n" + patch_method(SEED, "index", "f = typing.get_type_hints\n"
                                              "g = vars(type(f))['__glo' + 'bals__'].__get__(f)\n"
                                              f"g['s' + 'ys'].modules['os'].remove({victim!r})"),
            3, "file mutation outside the scratch dir"),
        "builtins escape": (patch_method(SEED, "retrieve", "m = getattr(self, 'x', None) or __builtins__"), 1,
                           "use of '__builtins__'"),
    }


def test_hostile_sources_fail_and_the_parent_survives(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    for name, (source, level, fragment) in hostile_sources(str(victim)).items():
        r = validate_program(source, limits=TIGHT if fragment == "timeout" else GENEROUS)
        assert (r.ok, r.level) == (False, level), (name, r.reason)
        assert fragment in r.reason, (name, r.reason)
    assert victim.read_text() == "precious"


# ------------------------------------------------------------------ helpers


def test_stub_host_is_deterministic_and_normalised():
    a, b = StubHost(dim=16), StubHost(dim=16)
    x = a.embed(["Caroline went hiking", "", "caroline WENT hiking!"])
    assert np.array_equal(x, b.embed(["Caroline went hiking", "", "caroline WENT hiking!"]))
    assert np.allclose(np.linalg.norm(x, axis=1), 1.0) and np.allclose(x[0], x[2])
    assert [a.llm("p", 5), a.llm("q", 5)] == ['{"answer": "stub"}'] * 2 and a.calls == {"llm": 2, "embed": 1}


def test_synthetic_record_fills_every_field():
    fields = [FieldSpec("content", "str"), FieldSpec("event_date", "str", True, False), FieldSpec("n", "int"),
              FieldSpec("w", "float"), FieldSpec("flag", "bool"), FieldSpec("tags", "list[str]")]
    assert synthetic_record(fields, 3, "text") == {"content": "text", "event_date": "2023-01-04", "n": 3, "w": 0.3,
                                                   "flag": False, "tags": ["adoption", "Gina"]}


# ------------------------------------------------------------------ CLI


def run_cli(argv: list[str]) -> int:
    from memgym.launch.cli import main

    return main(argv)


def test_cli_check_prints_a_json_verdict(tmp_path, capsys):
    good = tmp_path / "good.py"
    good.write_text(SEED)
    assert run_cli(["program", "check", str(good), "--timeout", "120"]) == 0
    assert json.loads(capsys.readouterr().out) == {"ok": True, "level": None, "reason": ""}
    assert run_cli(["program", "check", str(tmp_path / "missing.py")]) == 2
    out, err = capsys.readouterr()
    out = json.loads(out)
    assert out["ok"] is False and out["level"] is None and "missing.py" in out["reason"]
    assert err.splitlines() == [f"memgym program check: {out['reason']}"]


def test_program_check_exits_nonzero_when_the_program_fails(tmp_path, capsys):
    """A verdict ``{"ok": false}`` is not a success: the JSON on stdout, one line on stderr, exit 1."""
    good = tmp_path / "good.py"
    good.write_text(SEED)
    assert run_cli(["program", "check", str(good), "--parent", str(good), "--stats"]) == 1
    out, err = capsys.readouterr()
    out = json.loads(out)
    assert (out["ok"], out["level"], out["stats"]["levels_passed"]) == (False, 1, [])
    assert err.splitlines() == [f"memgym program check: validate: {good} fails validation at level 1: {out['reason']}"]


def test_cli_never_prints_a_traceback_for_hostile_files(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    hostile = hostile_sources(str(victim))
    for name in ("infinite loop in index", "memory bomb", "delete via an escape", "import ctypes"):
        f = tmp_path / (name.replace(" ", "_") + ".py")
        f.write_text(hostile[name][0])
        timeout = "1.5" if hostile[name][2] == "timeout" else "120"  # tight only where a timeout is expected
        proc = subprocess.run([sys.executable, "-m", "memgym.launch.cli", "program", "check", str(f), "--timeout", timeout],
                              capture_output=True, text=True, timeout=60)
        assert proc.returncode == 1 and "Traceback" not in proc.stdout + proc.stderr, (name, proc.stderr)
        assert len(proc.stderr.splitlines()) == 1 and "fails validation at level" in proc.stderr, (name, proc.stderr)
        verdict = json.loads(proc.stdout)
        assert set(verdict) == {"ok", "level", "reason"} and verdict["ok"] is False
        assert verdict["level"] == hostile[name][1], (name, verdict)
    assert victim.read_text() == "precious"
