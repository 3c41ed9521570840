"""Proposers: the library of component variants (applies to the seed and its descendants and
passes the four validation levels), constant mutations, the params proposer's determinism,
and the coder's parse → strict apply → repair → whole-file protocol on scripted answers."""
from __future__ import annotations

import random

import pytest

from memgym.evolution.execution.validate import ValidationLimits, validate_program
from memgym.evolution.search.archive import program_key
from memgym.evolution.search.edits import render_edits
from memgym.evolution.search.proposers.base import ProposalInput
from memgym.evolution.search.proposers.coder import CoderProposer, build_prompt
from memgym.evolution.search.proposers.library import LIBRARY, variant
from memgym.evolution.search.proposers.params import ParamsProposer, constant_mutations
from memgym.evolution.search.proposers.scripted import ScriptedProposer
from memgym.memory_bank.programs import read_program_source, seed_program_path

SEED = read_program_source(seed_program_path())
LIMITS = ValidationLimits(probe_units=600, probe_batches=30)


def _inp(source=SEED, target=None, known=frozenset(), diag=None, rnd=1):
    return ProposalInput(source, "seed", "cold" if target is None else "refine", target,
                         diag or {"overall": {"d_ext": 0.9, "d_idx": 0.5, "d_ret": 0.5, "answered": False}},
                         ["## Case x"], ["x"], [], [], known, extra={"round": rnd})


def test_every_library_variant_applies_to_the_seed_or_its_ranked_child_and_validates():
    dense, _ = variant("dense_ranking").apply(SEED)
    on_seed = {v.name for v in LIBRARY if _applies(v, SEED)}
    assert on_seed == {"dense_ranking", "date_words", "dedup", "answer_chronology", "answer_abstain",
                       "answer_aggregate"}
    stacked = dense
    for v in LIBRARY:
        if v.name == "dense_ranking":
            continue
        child, edits = v.apply(dense)
        assert edits and program_key(child) != program_key(dense)
        stacked, _ = v.apply(stacked)  # they also compose
    programs = [dense, stacked] + [variant(n).apply(SEED)[0] for n in ("date_words", "dedup")]
    for src in programs:
        res = validate_program(src, None, LIMITS)
        assert res.ok, res.reason
        assert res.stats["levels_passed"] == [1, 2, 3, 4]
    assert not _applies(variant("dense_ranking"), dense)  # the seed's Memory is gone: no double application


def _applies(v, src):
    try:
        v.apply(src)
        return True
    except Exception:  # noqa: BLE001
        return False


def test_constant_mutations_exact():
    src = 'OUT_CHAR_BUDGET = 16_000\nTOP_K = 40\nW = 0.3\nON = True\nMODE = "a"  # choices: a|b\nX = [1]\n'
    got = [d for d, _ in constant_mutations(src)]
    assert got == ["constant TOP_K: 40 -> 20", "constant TOP_K: 40 -> 30", "constant TOP_K: 40 -> 60",
                   "constant TOP_K: 40 -> 80", "constant W: 0.3 -> 0.15", "constant W: 0.3 -> 0.225",
                   "constant W: 0.3 -> 0.45", "constant W: 0.3 -> 0.6", "constant ON: True -> False",
                   "constant MODE: \"a\" -> 'b'"]
    edit = constant_mutations(src)[2][1]
    assert (edit.search, edit.replace) == ("TOP_K = 40\n", "TOP_K = 60\n")


def test_params_proposer_is_seeded_and_skips_archived_children():
    p = ParamsProposer()
    a = p.propose(_inp(), random.Random(3))
    b = p.propose(_inp(), random.Random(3))
    assert a.ok and a.source == b.source and a.description == b.description and a.turns == 0
    lib, mut = p.options(_inp())
    # no answer is generated (answered False): the answer variants are not offered at all
    assert [o[0].split(":")[0] for _, o in lib] == ["variant dense_ranking", "variant date_words", "variant dedup"]
    assert [w for w, _ in lib] == [pytest.approx(2.6), pytest.approx(1.8), pytest.approx(1.8)]
    known = frozenset(program_key(o[2]) for _, o in lib + mut)
    none = p.propose(_inp(known=known), random.Random(3))
    assert not none.ok and "no library variant" in none.reason
    # refinement weights: 3 for the target's variants, 1.5 for "*", 0.5 for the others
    dense, _ = variant("dense_ranking").apply(SEED)
    lib_t, _ = p.options(_inp(dense, target="T", diag={"overall": {}}))
    weights = {o[0].split(":")[0].split()[1]: w for w, o in lib_t}
    assert weights["time_hint"] == 3.0 and weights["date_words"] == 3.0 and weights["dedup"] == 1.5
    assert weights["mmr"] == 0.5 and weights["answer_chronology"] == 3.0
    assert weights["rank_order"] == 1.5
    # the target's own diagnostics row: T's evidence is in the units (d_ext 0.8) but retrieval misses
    # it (d_ret 0.3): retrieval variants x (1 + 4 x 0.5) = 3, indexing ones x (1 + 2 x 0.1) = 1.2
    diag_t = {"overall": {"d_ext": 0.5, "d_idx": 0.5, "d_ret": 0.5, "answered": False},
              "T": {"d_ext": 0.8, "d_idx": 0.7, "d_ret": 0.3}}
    lib_d, _ = p.options(_inp(dense, target="T", diag=diag_t))
    weights = {o[0].split(":")[0].split()[1]: w for w, o in lib_d}
    assert weights["time_hint"] == pytest.approx(9.0) and weights["date_words"] == pytest.approx(3.6)
    assert weights["mmr"] == pytest.approx(1.5) and weights["dedup"] == pytest.approx(1.8)
    assert "answer_chronology" not in weights
    # constant mutations weigh their variant's target factor: TIME_BONUS (time_hint, T) 3, TOP_K ("*") 1.5
    timed, _ = variant("time_hint").apply(dense)
    _, mut = p.options(_inp(timed, target="T", diag=diag_t))
    mw = {o[0].split(":")[0]: w for w, o in mut}
    assert mw["constant TIME_BONUS"] == 3.0 and mw["constant TOP_K"] == 1.5
    _, mut_f = p.options(_inp(timed, target="F", diag=diag_t))
    assert {o[0].split(":")[0]: w for w, o in mut_f}["constant TIME_BONUS"] == 0.5


GOOD = ("Halve the budget.\n<<<<<<< SEARCH\n        return \"\\n\".join(self.lines)[:OUT_CHAR_BUDGET]\n=======\n"
        "        return \"\\n\".join(reversed(self.lines))[:OUT_CHAR_BUDGET]\n>>>>>>> REPLACE\n")
MISS = "Fix.\n<<<<<<< SEARCH\n        return self.nothing\n=======\n        return ''\n>>>>>>> REPLACE\n"


def test_coder_protocol_repair_then_whole_file_then_failure():
    ok = ScriptedProposer([GOOD]).propose(_inp(), random.Random(0))
    assert ok.ok and "reversed(self.lines)" in ok.source and ok.turns == 1 and not ok.whole_file
    assert ok.description == "Halve the budget." and len(ok.edits) == 1
    # a miss → one repair turn with the closest region → fixed
    fixed = ScriptedProposer([[MISS, GOOD]]).propose(_inp(), random.Random(0))
    assert fixed.ok and fixed.turns == 2
    assert "closest region" in fixed.transcript[2]["messages"][-1]["content"] and "def retrieve(self, query):" in \
        fixed.transcript[2]["messages"][-1]["content"]
    # miss, miss → whole-file request → a file
    whole = ScriptedProposer([[MISS, MISS, "```python\n" + SEED.replace("self.lines = []", "self.lines = list()")
                               + "```"]]).propose(_inp(), random.Random(0))
    assert whole.ok and whole.whole_file and whole.turns == 3 and "list()" in whole.source
    assert "COMPLETE new program" in whole.transcript[4]["messages"][-1]["content"]
    # prose all the way → fails with its reason after three turns
    prose = ScriptedProposer(["I would improve retrieval."]).propose(_inp(), random.Random(0))
    assert not prose.ok and prose.turns == 3 and "no usable program" in prose.reason
    # a dead backend fails the proposal, not the run
    def boom(messages):
        raise ConnectionError("server down")
    dead = CoderProposer(boom).propose(_inp(), random.Random(0))
    assert not dead.ok and dead.reason == "coder call failed: ConnectionError: server down"


def test_coder_prompt_holds_interface_source_target_diagnostics_cases_lineage():
    from memgym.evolution.search.proposers.base import LineageEntry

    inp = _inp(target="T", diag={"T": {"n": 3, "score": 0.25, "d_ext": 0.9, "d_idx": 0.4, "d_ret": 0.3,
                                       "unit_chars": 80.0, "retrieved_chars": 16000.0}})
    inp.ancestors = [LineageEntry("seed", "seed", None, "seed program", [], None)]
    inp.failed = [LineageEntry("r02", "refine", "T", "variant mmr", ["retrieval"], {"overall": -0.01, "T": 0.0},
                               "no capability's valid score improved")]
    sys_msg, user = build_prompt(inp)
    assert "class Memory with __init__(self, toolkit)" in sys_msg["content"] and "<<<<<<< SEARCH" in sys_msg["content"]
    u = user["content"]
    assert "Improve capability T" in u and "| T | 3 | 0.250 | 0.900 | 0.400 | 0.300 | 80.000 | 16000.000 |" in u
    assert "   1| \"\"\"PrisMem seed memory program" in u and "## Case x" in u
    assert "- r02 [refine, target T] variant mmr (overall -0.010, T +0.000) -- not accepted: no capability's" in u
    assert render_edits(ScriptedProposer([GOOD]).propose(_inp(), random.Random(0)).edits).count("<<<<<<< SEARCH") == 1


def test_no_variant_applies_twice():
    """A variant already in the program is not offered again (it would define its helpers twice,
    which the component merge refuses: seen on `make demo-evolve`, hybrid_lexical on top of itself)."""
    dense, _ = variant("dense_ranking").apply(SEED)
    for v in LIBRARY:
        base = dense if v.name != "dedup" else SEED
        try:
            once, _ = v.apply(base)
        except Exception:  # noqa: BLE001 - does not apply here at all
            continue
        assert not _applies(v, once), v.name
