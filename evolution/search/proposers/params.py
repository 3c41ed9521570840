"""The offline ``params`` proposer: no LLM, seeded, deterministic given the run's RNG.

Source: docs/design.md § "Capability-driven evolution" (proposers). It proposes a library variant
(:mod:`memgym.evolution.search.proposers.library`) that applies to the parent, or a constant mutation
(a module-level int/float scaled by 0.5, 0.75, 1.5 or 2, a bool flipped, a string annotated
``# choices: a|b|c`` switched; never :data:`PROTECTED`). Children already archived are dropped,
and answer variants when no answer is generated. A library variant is chosen with probability
:data:`LIBRARY_SHARE` when both kinds exist. A variant's weight is the product of:

- target factor: 3 when it names the target, 1.5 for all ("*"), 0.5 otherwise; 1 in cold start;
- diagnostics factor (target's row, else overall): 1 + 4·max(0, d_ext − d_ret) for retrieval
  variants, 1 + 2·max(0, d_ext − d_idx) for indexing ones, 1 otherwise; a budget variant with
  ``b`` = the target row's ``budget_cut`` share names the target when b ≥ :data:`BUDGET_TAG` and
  has factor 1 + :data:`BUDGET_GAIN`·b;
- cue factor (:func:`case_factor`): ``time_hint`` by the share of case questions naming a
  month/year, ``date_words`` by the share of reference answers naming a month or weekday.

A constant mutation weighs the target factor of the variant that introduced the constant, else 1.
"""
from __future__ import annotations

import ast
import random
import re

from memgym.evolution.search.archive import program_key
from memgym.evolution.search.edits import Edit, EditError, apply_edits, render_edits
from memgym.evolution.search.proposers.base import ProposalInput, ProposalResult
from memgym.evolution.search.proposers.library import LIBRARY, Variant

PROTECTED = frozenset({"OUT_CHAR_BUDGET", "EMBED_CHARS"})
SCALES = (0.5, 0.75, 1.5, 2.0)
LIBRARY_SHARE = 0.6
BUDGET_TAG = 0.2
BUDGET_GAIN = 4.0
CUE_FLOOR = 0.25


def constant_mutations(source: str) -> list[tuple[str, Edit]]:
    """Every single-constant mutation of ``source``: ``[(description, edit)]`` in source order
    (see the module doc). Multi-line assignments are skipped."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    lines = source.splitlines(keepends=True)
    out = []
    for node in tree.body:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        name = node.targets[0].id
        if name in PROTECTED or name.endswith("_INSTRUCTION") or node.lineno != node.end_lineno:
            continue
        if not isinstance(node.value, ast.Constant):
            continue
        v = node.value.value
        line = lines[node.lineno - 1]
        seg = ast.get_source_segment(source, node.value)
        if seg is None:
            continue
        news = []
        if isinstance(v, bool):
            news = [repr(not v)]
        elif isinstance(v, int):
            news = sorted({max(1, round(v * s)) for s in SCALES} - {v})
            news = [str(x) for x in news]
        elif isinstance(v, float):
            vals = {round(v * s, 4) for s in SCALES} if v else {0.05, 0.1, 0.2}
            news = [repr(x) for x in sorted(vals - {v})]
        elif isinstance(v, str) and "# choices:" in line:
            choices = [c.strip() for c in line.split("# choices:", 1)[1].split("|") if c.strip()]
            news = [repr(c) for c in choices if c != v]
        for new in news:
            new_line = line.replace(seg, new, 1)
            if new_line != line:
                out.append((f"constant {name}: {seg} -> {new}", Edit(line, new_line)))
    return out


def _answered(inp: ProposalInput) -> bool:
    """False when the diagnostics say the scorer generates no answer (offline proxies)."""
    return inp.diagnostics.get("overall", {}).get("answered") is not False


def _target_factor(capabilities: str, target: str | None) -> float:
    if target is None:
        return 1.0
    if target in capabilities:
        return 3.0
    return 1.5 if capabilities == "*" else 0.5


def _row(inp: ProposalInput, key: str) -> dict:
    """The target's diagnostics row when it measures ``key``, else the overall row."""
    row = inp.diagnostics.get(inp.target, {}) if inp.target is not None else {}
    return row if row and row.get(key) is not None else inp.diagnostics.get("overall", {})


def _variant_weight(v: Variant, inp: ProposalInput) -> float:
    """The variant's weight (module doc); 0.0 = not offered."""
    if v.component == "answer" and not _answered(inp):
        return 0.0  # no answer is generated: the answer instruction cannot matter
    row = _row(inp, "d_ext")
    d_ext, d_ret, d_idx = (row.get(k) for k in ("d_ext", "d_ret", "d_idx"))
    diag = 1.0
    if v.component == "retrieval" and d_ext is not None and d_ret is not None:
        diag = 1.0 + 4.0 * max(0.0, d_ext - d_ret)
    elif v.component == "indexing" and d_ext is not None and d_idx is not None:
        diag = 1.0 + 2.0 * max(0.0, d_ext - d_idx)
    cut = _row(inp, "budget_cut").get("budget_cut") if v.budget else None
    if cut is not None:  # tagged by its measured effect under the budget, not by hand
        caps = inp.target if inp.target is not None and cut >= BUDGET_TAG else v.capabilities
        return _target_factor(caps or v.capabilities, inp.target) * (1.0 + BUDGET_GAIN * cut)
    return _target_factor(v.capabilities, inp.target) * diag * case_factor(v, inp.cases)


def _case_fields(cases: list[str], prefix: str) -> list[str]:
    """The ``prefix`` line's text of each rendered case that has one."""
    out = []
    for case in cases:
        line = next((x for x in case.splitlines() if x.startswith(prefix)), None)
        if line is not None:
            out.append(line[len(prefix):])
    return out


_MONTH_YEAR = re.compile(r"\b(january|february|march|april|may|june|july|august|september|october|november|"
                         r"december)\w*,?\s+\d{4}\b|\b(19|20)\d\d\b", re.I)
_DATE_WORD = re.compile(r"\b(january|february|march|april|may|june|july|august|september|october|november|"
                        r"december|monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b", re.I)


def case_share(variant_name: str, cases: list[str]) -> float | None:
    """The share of the shown cases a cue variant can act on (module doc); None for a variant
    without a cue, without cases, or when no case has the line it reads."""
    if variant_name == "time_hint":
        texts, rule = _case_fields(cases, "Question: "), _MONTH_YEAR
    elif variant_name == "date_words":
        texts, rule = _case_fields(cases, "Reference answer: "), _DATE_WORD
    else:
        return None
    return sum(bool(rule.search(t)) for t in texts) / len(texts) if texts else None


def case_factor(v: Variant, cases: list[str]) -> float:
    """:data:`CUE_FLOOR` + (1 − :data:`CUE_FLOOR`)·2·share for a cue variant, 1 otherwise."""
    share = case_share(v.name, cases)
    return 1.0 if share is None else CUE_FLOOR + (1.0 - CUE_FLOOR) * 2.0 * share


def constant_owners(library: tuple[Variant, ...] = LIBRARY) -> dict[str, str]:
    """Constant name → capabilities of the first library variant whose edits introduce it
    (``NAME = ...`` at the start of a line of a REPLACE text)."""
    import re

    out: dict[str, str] = {}
    for v in library:
        for block in v.blocks:
            for _, replace in block.forms:
                for name in re.findall(r"^([A-Z][A-Z0-9_]*) = ", replace, flags=re.M):
                    out.setdefault(name, v.capabilities)
    return out


def _mutation_weight(desc: str, owners: dict[str, str], inp: ProposalInput) -> float:
    name = desc.split(" ", 2)[1].rstrip(":")
    return _target_factor(owners[name], inp.target) if name in owners else 1.0


def _weighted(rng: random.Random, options: list[tuple[float, object]]):
    total = sum(w for w, _ in options)
    x = rng.random() * total
    for w, o in options:
        x -= w
        if x < 0:
            return o
    return options[-1][1]


class ParamsProposer:
    """See the module doc. ``library``: the variants to draw from (default :data:`LIBRARY`)."""

    name = "params"
    needs_cases = True  # reads the diagnostics table, the target and the questions/answers of its cases

    def __init__(self, library: tuple[Variant, ...] = LIBRARY):
        self.library = library

    def options(self, inp: ProposalInput) -> tuple[list, list]:
        """(library options, mutation options) as ``[(weight, (description, edits, source))]``,
        children already archived removed."""
        lib, mut = [], []
        for v in self.library:
            weight = _variant_weight(v, inp)
            if weight <= 0.0:
                continue
            try:
                child, edits = v.apply(inp.source)
            except EditError:
                continue
            if program_key(child) not in inp.known_keys:
                lib.append((weight, (f"variant {v.name}: {v.description}", edits, child)))
        owners = constant_owners(self.library)
        for desc, edit in constant_mutations(inp.source):
            try:
                child = apply_edits(inp.source, [edit])
                key = program_key(child)
            except (EditError, SyntaxError):
                continue
            if key not in inp.known_keys:
                mut.append((_mutation_weight(desc, owners, inp), (desc, [edit], child)))
        return lib, mut

    def exhausted(self, inp: ProposalInput) -> bool:
        """True when no library variant or constant mutation gives a new program for ``inp``."""
        lib, mut = self.options(inp)
        return not lib and not mut

    def propose(self, inp: ProposalInput, rng: random.Random) -> ProposalResult:
        lib, mut = self.options(inp)
        if not lib and not mut:
            return ProposalResult(False, reason="no library variant or constant mutation gives a new program")
        use_lib = bool(lib) and (not mut or rng.random() < LIBRARY_SHARE)
        desc, edits, child = _weighted(rng, lib if use_lib else mut)
        menu = "\n".join(f"{w:.2f}  {o[0]}" for w, o in lib + mut)
        return ProposalResult(True, child, list(edits), False, desc,
                              transcript=[{"role": "options", "content": menu},
                                          {"role": "choice", "content": f"{desc}\n{render_edits(edits)}"}])

    def revise(self, inp, result, verdict, rng):
        return None
