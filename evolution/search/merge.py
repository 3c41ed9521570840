"""Offline component-level merge of capability specialists (PrisMem stage III without an LLM).

Source: docs/design.md § "Capability-driven evolution" (trace-guided integration). Granularity: the
elements of :mod:`memgym.evolution.search.elements`. Each specialist S is compared, element by element,
with its merge base: the latest version of the element in S's lineage that the base's lineage also
holds (else S's common ancestor with the base). No specialist changed it → the base's version; one
distinct changed version the base did not also change → that version; otherwise a conflict,
settled by :func:`settle`. Definitions the base lacks that nothing in the merge uses are dropped.
The merged module follows the base's order; a new element goes after its nearest placed
predecessor. The result is not validated here (the integrator does).
"""
from __future__ import annotations

import ast
import textwrap
from dataclasses import dataclass, field

from memgym.evolution.search.archive import CAPABILITIES
from memgym.evolution.search.elements import (ABSENT, Element, MergeError, ProgramParts, element_key, render,
                                       split_program)

__all__ = ["ABSENT", "Conflict", "Contender", "Element", "MergeError", "MergeResult", "ProgramParts",
           "component_merge", "element_key", "render", "settle", "split_program"]


@dataclass
class Contender:
    """A program in a merge: archive ``id``, ``source``, ``capabilities`` it specialises in ("" for
    the base), ``paired_scores`` (case id → train score in [0, 1]), ``train_overall`` (or None)."""

    id: str
    source: str
    capabilities: str = ""
    paired_scores: dict = field(default_factory=dict)
    train_overall: float | None = None


@dataclass
class Conflict:
    """An element changed differently by several programs; ``versions``: one dict per version
    (``holders``, ``score``, ``paired``); ``rule``: ``"train overall"`` or ``"paired cases"``."""

    key: str
    component: str
    cases: list
    versions: list
    winner: str
    rule: str = "train overall"

    def to_dict(self) -> dict:
        return {"key": self.key, "component": self.component, "cases": list(self.cases),
                "versions": self.versions, "winner": self.winner, "rule": self.rule}


@dataclass
class MergeResult:
    """``source``: merged program; ``provenance``: element key → source program id;
    ``components``: component → contributing specialist ids; ``conflicts``; ``contributors``."""

    source: str
    provenance: dict
    components: dict
    conflicts: list
    contributors: list

    def to_dict(self) -> dict:
        return {"provenance": dict(self.provenance), "components": {k: list(v) for k, v in self.components.items()},
                "conflicts": [c.to_dict() for c in self.conflicts], "contributors": list(self.contributors)}


def _cap_rank(c: Contender) -> int:
    return min((CAPABILITIES.index(x) for x in c.capabilities if x in CAPABILITIES), default=len(CAPABILITIES))


def settle(key: str, component: str, versions: dict[str, list[Contender]], base_id: str,
           cases: list[str]) -> Conflict:
    """Settle one conflict. ``versions``: normalised version → holders; ``cases``: the merge's
    paired case ids. A version scores its best holder's train overall (ties: mean over ``cases``),
    or the mean over ``cases`` alone when a holder lacks a train overall; the highest wins, ties
    going to the base's version, then the earliest capability (F, T, P, M, A)."""
    rule = "train overall" if all(h.train_overall is not None for hs in versions.values() for h in hs) \
        else "paired cases"

    def paired(h: Contender) -> float:
        return sum(h.paired_scores.get(t, 0.0) for t in cases) / len(cases) if cases else 0.0

    def rank(h: Contender) -> tuple:
        return (round(h.train_overall, 12), round(paired(h), 12)) if rule == "train overall" \
            else (round(paired(h), 12),)

    rows = []
    for holders in versions.values():
        best = max(holders, key=lambda h: (rank(h), -_cap_rank(h)))
        rows.append({"holders": [h.id for h in holders], "_rank_key": rank(best), "_best": best,
                     "score": best.train_overall if rule == "train overall" else paired(best), "paired": paired(best),
                     "_base": any(h.id == base_id for h in holders), "_rank": min(_cap_rank(h) for h in holders)})
    win = max(rows, key=lambda r: (r["_rank_key"], r["_base"], -r["_rank"]))
    return Conflict(key, component, list(cases),
                    [{"holders": r["holders"], "score": r["score"], "paired": r["paired"]} for r in rows],
                    win["_best"].id, rule)


def component_merge(base: Contender, specialists: list[Contender], ancestors: dict[str, str],
                    paired: dict[str, str] | None = None, exclude: set | frozenset = frozenset(),
                    lineages: dict[str, list[str]] | None = None) -> MergeResult:
    """Merge ``specialists`` into ``base`` (module doc).

    ``ancestors``: specialist id → source of its common ancestor with the base. ``paired``:
    capability → its paired differential case id (conflicts settle on these, :func:`settle`).
    ``exclude``: ``(specialist id, element key)`` pairs that do not contend. ``lineages``: program
    id → its lineage's sources, oldest first (enables per-element merge bases).
    Raises :class:`MergeError` when a program cannot be split or a specialist has no ancestor.
    """
    paired = paired or {}
    all_cases = list(dict.fromkeys(paired[c] for c in CAPABILITIES if c in paired))
    specs = [s for s in specialists if s.id != base.id]
    progs = [base] + specs
    parts = {p.id: split_program(p.source, p.id) for p in progs}
    maps = {pid: pp.element_map() for pid, pp in parts.items()}
    anc_maps = {}
    for s in specs:
        if s.id not in ancestors:
            raise MergeError(f"no common ancestor given for specialist {s.id}")
        anc_maps[s.id] = split_program(ancestors[s.id], f"ancestor of {s.id}").element_map()
    keys: list[str] = []
    for m in list(maps.values()) + list(anc_maps.values()):
        keys += [k for k in m if k not in keys]

    def norm(m: dict, k: str) -> str:
        return m[k].norm if k in m else ABSENT

    hist = _lineage_maps(lineages, [p.id for p in progs])

    def anc(s: Contender, k: str) -> str:
        """Merge base of ``k`` for ``s`` (module doc)."""
        if s.id in hist and base.id in hist:
            seen = {norm(m, k) for m in hist[base.id]}
            hit = next((norm(m, k) for m in reversed(hist[s.id]) if norm(m, k) in seen), None)
            if hit is not None:
                return hit
        return norm(anc_maps[s.id], k)

    pick: dict[str, Element] = {}
    prov: dict[str, str] = {}
    comp_of: dict[str, str] = {}
    conflicts = []
    for k in keys:
        b = norm(maps[base.id], k)
        changers = [s for s in specs if norm(maps[s.id], k) != anc(s, k) and (s.id, k) not in exclude]
        versions: dict[str, list[Contender]] = {}
        for s in changers:
            versions.setdefault(norm(maps[s.id], k), []).append(s)
        # the base contends when it changed k since a changer's ancestor, to a different version
        if any(b != anc(s, k) for s in changers) and b not in versions:
            versions = {b: [base], **versions}
        elif b in versions:
            versions[b] = [base] + versions[b]
        if not changers or (len(versions) == 1 and base in next(iter(versions.values()))):
            if k in maps[base.id]:
                pick[k], prov[k] = maps[base.id][k], base.id
            continue
        some = next(m[k] for m in list(maps.values()) + list(anc_maps.values()) if k in m)
        if len(versions) == 1:
            winner = next(iter(versions.values()))[0]
        else:
            conf = settle(k, some.component, versions, base.id, all_cases)
            conflicts.append(conf)
            winner = next(p for p in progs if p.id == conf.winner)
        prov[k], comp_of[k] = winner.id, some.component
        if k in maps[winner.id]:
            pick[k] = maps[winner.id][k]
    for k in _prune(pick, maps[base.id]):
        del prov[k]
    comps = {}
    for k, pid in prov.items():
        if pid != base.id:
            comps.setdefault(comp_of[k], set()).add(pid)
    source = _assemble(base, parts, pick, progs)
    order = [p.id for p in progs]
    contributors = sorted({pid for ids in comps.values() for pid in ids}, key=order.index)
    return MergeResult(source, prov, {k: sorted(v, key=order.index) for k, v in comps.items()}, conflicts,
                       contributors)


def _lineage_maps(lineages: dict[str, list[str]] | None, ids: list[str]) -> dict[str, list[dict]]:
    """id → element maps of its lineage's programs (each distinct source split once); programs
    that cannot be split are skipped (their versions are then unknown, not absent)."""
    if not lineages:
        return {}
    memo: dict[str, dict | None] = {}
    out = {}
    for pid in ids:
        if pid not in lineages:
            continue
        maps = []
        for src in lineages[pid]:
            if src not in memo:
                try:
                    memo[src] = split_program(src).element_map()
                except MergeError:
                    memo[src] = None
            if memo[src] is not None:
                maps.append(memo[src])
        out[pid] = maps
    return out


def _refs(el: Element) -> set[str]:
    """Names an element's code loads (its own text parsed; members are dedented)."""
    try:
        tree = ast.parse(textwrap.dedent(el.text))
    except SyntaxError:
        return set()
    return {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}


def _prune(pick: dict[str, Element], base_map: dict[str, Element]) -> list[str]:
    """Drop module-level definitions and imports the base lacks that nothing else in the merge
    uses (a losing specialist's helpers and their imports, repeatedly); returns the dropped
    keys. Contract names, other statements and everything the base has are kept."""
    dropped = []
    refs = {k: _refs(e) for k, e in pick.items()}
    while True:
        gone = []
        for k, e in pick.items():
            names = set(k.removeprefix("def ").removeprefix("class ").split(","))
            if k in base_map or e.container != "module" or k == "class Memory":
                continue
            if not all(n.isidentifier() for n in names):  # an import binds its names; other statements stay
                names = _import_names(e)
                if not names:
                    continue
            if not any(names & refs[o] for o in pick if o != k):
                gone.append(k)
        if not gone:
            return dropped
        for k in gone:
            pick.pop(k)
            refs.pop(k)
        dropped += gone


def _import_names(el: Element) -> set[str]:
    """Names an ``import`` / ``from ... import`` element binds (empty for any other statement and
    for ``from __future__``)."""
    try:
        tree = ast.parse(textwrap.dedent(el.text))
    except SyntaxError:
        return set()
    st = tree.body[-1] if tree.body else None
    if isinstance(st, ast.Import):
        return {a.asname or a.name.split(".")[0] for a in st.names}
    if isinstance(st, ast.ImportFrom) and st.module != "__future__":
        return {a.asname or a.name for a in st.names if a.name != "*"}
    return set()


def _order(base_keys: list[str], chosen: set[str], sequences: list[list[str]]) -> list[str]:
    """Base order of the chosen keys, then each missing key after its nearest placed
    predecessor in the first sequence that holds it."""
    out = [k for k in base_keys if k in chosen]
    for seq in sequences:
        for i, k in enumerate(seq):
            if k in chosen and k not in out:
                prev = next((seq[j] for j in range(i - 1, -1, -1) if seq[j] in out), None)
                out.insert(0 if prev is None else out.index(prev) + 1, k)
    return out


def _assemble(base: Contender, parts: dict[str, ProgramParts], pick: dict[str, Element],
               progs: list[Contender]) -> str:
    bp = parts[base.id]
    mod_chosen = {k for k, e in pick.items() if e.container == "module"}
    mem_chosen = {k for k, e in pick.items() if e.container == "Memory"}
    mod = _order([e.key for e in bp.module], mod_chosen, [[e.key for e in parts[p.id].module] for p in progs])
    mem = _order([e.key for e in bp.memory], mem_chosen, [[e.key for e in parts[p.id].memory] for p in progs])
    if "class Memory" not in mod:
        raise MergeError("the merge removed class Memory")
    return render(bp, mod, mem, pick)
