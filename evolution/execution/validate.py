"""Four-level validation of a candidate memory program before any task-model call.

Source: PrisMem (arXiv 2610.06361), appendix "execution checks":
1. source and module completeness (parses, allowed imports, differs from its parent, loads,
   defines MemoryUnit, Query, Memory and the three instructions);
2. schema and signature compatibility;
3. smoke tests on :class:`StubHost` (``retrieve`` returns a str of <= 16,000 characters);
4. a complexity probe (~2K units in 100 batches, 2 queries) within CPU, wall and call budgets.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from datetime import date, timedelta

import numpy as np
from tqdm import tqdm

from memgym.evolution.execution.component_diff import normalised_ast
from memgym.evolution.execution.sandbox import DEFAULT_ALLOWED_IMPORTS, SandboxError, SandboxedProgram, SandboxLimits, static_check
from memgym.llm.embeddings import HashEmbedder
from memgym.memory_bank.contract import OUT_CHAR_BUDGET, ContractError, FieldSpec, SessionInfo

_WORDS = ("hiking", "painting", "guitar", "adoption", "marathon", "pottery", "camping", "museum", "sunrise",
          "violin", "career", "counseling", "festival", "library", "garden", "recipe", "puppy", "concert")
_NAMES = ("Caroline", "Melanie", "Jon", "Gina", "Tim", "John", "Maria", "Audrey")


class StubHost:
    """Deterministic local backend: hashed bag-of-words ``embed`` ((n, ``dim``) float32) and an
    ``llm`` cycling through ``responses``; ``calls`` counts {"llm", "embed"}.
    """

    def __init__(self, dim: int = 64, responses: tuple[str, ...] = ('{"answer": "stub"}',)):
        self.embedder = HashEmbedder(dim)  # ValueError for dim < 1
        self.responses = tuple(responses)
        self.calls = {"llm": 0, "embed": 0}

    def embed(self, texts: list[str]) -> np.ndarray:
        self.calls["embed"] += 1
        return self.embedder.encode(list(texts))

    def llm(self, prompt: str, max_tokens: int) -> str:
        r = self.responses[self.calls["llm"] % len(self.responses)]
        self.calls["llm"] += 1
        return r


@dataclass(frozen=True)
class ValidationLimits:
    """Budgets of the four levels: sandbox limits, the level-3 workload and call budgets, the
    level-4 workload (units, batches, queries, embedding dim), CPU / wall seconds and call caps;
    ``run_probe`` False skips level 4.
    """

    sandbox: SandboxLimits = field(default_factory=lambda: SandboxLimits(call_timeout_s=20.0, load_timeout_s=20.0))
    smoke_units: int = 5
    smoke_llm_calls: int = 20
    smoke_embed_calls: int = 20
    probe_units: int = 2000
    probe_batches: int = 100
    probe_queries: int = 2
    probe_embed_dim: int = 384
    probe_cpu_s: float = 30.0
    probe_wall_s: float = 90.0
    probe_max_llm_calls: int = 100
    probe_max_embed_calls: int = 250
    run_probe: bool = True


@dataclass
class ValidationResult:
    """``ok``; ``level``: the first failing level (1-4) or None; ``reason``; ``stats``: timings (s),
    call counts, output sizes (characters) and ``sandbox`` (the confinement; an UNCONFINED one is
    also a top-level key of :meth:`to_dict`).
    """

    ok: bool
    level: int | None
    reason: str
    stats: dict = field(default_factory=dict)

    def to_dict(self, with_stats: bool = False) -> dict:
        d = {"ok": self.ok, "level": self.level, "reason": self.reason}
        if str(self.stats.get("sandbox", "")).startswith("UNCONFINED"):
            d["sandbox"] = self.stats["sandbox"]
        if with_stats:
            d["stats"] = self.stats
        return d


def synthetic_record(fields: tuple[FieldSpec, ...] | list[FieldSpec], i: int, text: str) -> dict:
    """A JSON record filling every field: str fields get ``text`` (fields whose name contains
    "date" or "time" an ISO date 2023-01-01 + i days), int -> i, float -> i / 10,
    bool -> i is even, list[str] -> two tags."""
    day = (date(2023, 1, 1) + timedelta(days=i)).isoformat()
    rec = {}
    for f in fields:
        if f.kind == "str":
            rec[f.name] = day if ("date" in f.name or "time" in f.name) else text
        elif f.kind == "int":
            rec[f.name] = i
        elif f.kind == "float":
            rec[f.name] = i / 10
        elif f.kind == "bool":
            rec[f.name] = i % 2 == 0
        else:
            rec[f.name] = [_WORDS[i % len(_WORDS)], _NAMES[i % len(_NAMES)]]
    return rec


def _unit_text(i: int) -> str:
    a, b, c = _NAMES[i % len(_NAMES)], _WORDS[i % len(_WORDS)], _WORDS[(i * 7 + 3) % len(_WORDS)]
    return f"{a} talked about {b} and {c} (synthetic fact {i})."


def _check_index(value, stage: str) -> None:
    if value is not None:
        raise _Fail(f"{stage}: index must return None, returned {type(value).__name__}")


def _check_retrieve(value, stage: str) -> int:
    if not isinstance(value, str):
        raise _Fail(f"{stage}: retrieve must return str, returned {type(value).__name__}")
    if len(value) > OUT_CHAR_BUDGET:
        raise _Fail(f"{stage}: retrieve returned {len(value)} characters > OUT_CHAR_BUDGET {OUT_CHAR_BUDGET}")
    return len(value)


class _Fail(Exception):
    pass


def _describe(e: SandboxError) -> str:
    return f"{e.stage or 'sandbox'} {e.kind}: {e.reason}"


def validate_program(source: str, parent_source: str | None = None, limits: ValidationLimits | None = None, *,
                     allowed_imports: frozenset = DEFAULT_ALLOWED_IMPORTS, progress: bool = False) -> ValidationResult:
    """Run the four levels on ``source``, stopping at the first failure (``parent_source``: it must
    differ after AST normalisation). Never raises for what the candidate does.
    """
    limits = limits or ValidationLimits()
    stats: dict = {"levels_passed": []}
    level = 1
    sandbox: SandboxedProgram | None = None
    t0 = time.perf_counter()
    try:
        if not isinstance(source, str):
            return ValidationResult(False, 1, f"source must be str, got {type(source).__name__}", stats)
        problems = static_check(source, allowed_imports)
        if problems:
            return ValidationResult(False, 1, "; ".join(problems[:5]), stats)
        if parent_source is not None:
            try:
                same = normalised_ast(parent_source) == normalised_ast(source)
            except SyntaxError:
                same = False  # an unparsable parent cannot equal a parsable patch
            if same:
                return ValidationResult(False, 1, "patch makes no real change (identical to the parent after AST "
                                        "normalisation)", stats)
        host = StubHost(dim=limits.probe_embed_dim)
        try:
            sandbox = SandboxedProgram(
                source, host, limits.sandbox, llm_budget=limits.smoke_llm_calls + limits.probe_max_llm_calls,
                embed_budget=limits.smoke_embed_calls + limits.probe_max_embed_calls,
                allowed_imports=allowed_imports, skip_static_check=True)
        except SandboxError as e:
            return ValidationResult(False, 1, f"module failed to load: {_describe(e)}", stats)
        stats["load_s"] = round(time.perf_counter() - t0, 3)
        stats["sandbox"] = sandbox.confinement
        try:
            info = sandbox.info
        except ContractError as e:
            return ValidationResult(False, e.level, str(e), stats)
        stats["levels_passed"] = [1, 2]

        level = 3
        t3 = time.perf_counter()
        sandbox.construct()
        units = [synthetic_record(info.unit_fields, i, _unit_text(i)) for i in range(limits.smoke_units)]
        _check_index(sandbox.index(units, SessionInfo(1, "smoke-1", "2023-01-01T10:00:00", "10:00 am on 1 January, 2023")),
                     "smoke index")
        _check_index(sandbox.index([], SessionInfo(2, "smoke-2", "2023-01-02T10:00:00", "10:00 am on 2 January, 2023")),
                     "smoke index of an empty session")
        query = synthetic_record(info.query_fields, 1, "What did Melanie talk about?")
        stats["smoke_retrieve_chars"] = _check_retrieve(sandbox.retrieve(query), "smoke retrieve")
        stats["smoke_s"] = round(time.perf_counter() - t3, 3)
        stats["levels_passed"].append(3)
        if not limits.run_probe:
            stats["probe"] = "skipped"
            return ValidationResult(True, None, "", stats)

        level = 4
        result = _probe(sandbox, info, limits, stats, progress)
        if result is not None:
            return ValidationResult(False, 4, result, stats)
        stats["levels_passed"].append(4)
        return ValidationResult(True, None, "", stats)
    except SandboxError as e:
        return ValidationResult(False, level, _describe(e), stats)
    except _Fail as e:
        return ValidationResult(False, level, str(e), stats)
    except Exception as e:  # noqa: BLE001 - a validator bug must still yield a verdict, never a traceback
        return ValidationResult(False, level, f"validator error: {type(e).__name__}: {e}", stats)
    finally:
        if sandbox is not None:
            stats["stderr_bytes"] = sandbox.stderr_bytes
            sandbox.close()
        stats["total_s"] = round(time.perf_counter() - t0, 3)


def _probe(sandbox: SandboxedProgram, info, limits: ValidationLimits, stats: dict, progress: bool) -> str | None:
    """Level 4; returns a failure reason or None."""
    sandbox.construct()
    calls0, cpu0, wall0 = sandbox.toolkit_calls, sandbox.stats["cpu_s"], sandbox.stats["wall_s"]
    per = max(1, limits.probe_units // limits.probe_batches)
    n = 0
    bar = tqdm(total=limits.probe_batches + limits.probe_queries, desc="complexity probe", disable=not progress,
               leave=False)
    try:
        for b in range(limits.probe_batches):
            units = [synthetic_record(info.unit_fields, n + k, _unit_text(n + k)) for k in range(per)]
            n += per
            day = date(2023, 1, 1) + timedelta(days=b)
            _check_index(sandbox.index(units, SessionInfo(b + 1, f"probe-{b + 1}", f"{day.isoformat()}T09:00:00",
                                                          day.strftime("%d %B, %Y"))), f"probe batch {b + 1}")
            bar.update(1)
            cpu, wall = sandbox.stats["cpu_s"] - cpu0, sandbox.stats["wall_s"] - wall0
            if cpu > limits.probe_cpu_s or wall > limits.probe_wall_s:
                stats.update(probe_units=n, probe_cpu_s=round(cpu, 3), probe_wall_s=round(wall, 3))
                what = f"{cpu:.1f} s CPU > budget {limits.probe_cpu_s:g} s" if cpu > limits.probe_cpu_s \
                    else f"{wall:.1f} s wall time > budget {limits.probe_wall_s:g} s"
                return f"probe used {what} after {b + 1} of {limits.probe_batches} batches"
        max_chars = 0
        for q in range(limits.probe_queries):
            query = synthetic_record(info.query_fields, q, f"What did {_NAMES[q]} say about {_WORDS[q]}?")
            max_chars = max(max_chars, _check_retrieve(sandbox.retrieve(query), f"probe query {q + 1}"))
            bar.update(1)
    finally:
        bar.close()
    calls = {k: v - calls0[k] for k, v in sandbox.toolkit_calls.items()}
    cpu, wall = sandbox.stats["cpu_s"] - cpu0, sandbox.stats["wall_s"] - wall0
    stats.update(probe_units=n, probe_cpu_s=round(cpu, 3), probe_wall_s=round(wall, 3), probe_llm_calls=calls["llm"],
                 probe_embed_calls=calls["embed"], probe_retrieve_chars=max_chars)
    if cpu > limits.probe_cpu_s:
        return f"probe used {cpu:.1f} s CPU > budget {limits.probe_cpu_s:g} s"
    if wall > limits.probe_wall_s:
        return f"probe took {wall:.1f} s > budget {limits.probe_wall_s:g} s"
    if calls["llm"] > limits.probe_max_llm_calls or calls["refused"]:
        return f"probe made {calls['llm']} llm calls (cap {limits.probe_max_llm_calls}, {calls['refused']} refused)"
    if calls["embed"] > limits.probe_max_embed_calls:
        return f"probe made {calls['embed']} embed calls > cap {limits.probe_max_embed_calls}"
    return None
