"""Trace-guided integration's pure parts and the ablation policies: the acceptance rule with δ on
hand-made score tables, the paired differential case choice, the component-level merge
(provenance per element, conflicts settled on the paired cases, the merged program passes the
four validation levels), round-robin targets, seeded random cases, holistic parents/cases."""
from __future__ import annotations

import random

import pytest

from memgym.evolution.search.api import build_engine
from memgym.evolution.search.archive import Archive, Candidate, SplitScores
from memgym.evolution.search.config import EvolveConfig
from memgym.evolution.search.edits import apply_edits
from memgym.evolution.search.integrate import blame, integration_verdict, paired_case, paired_cases
from memgym.evolution.search.merge import Contender, MergeError, component_merge, element_key, split_program
from memgym.evolution.search.proposers.library import variant
from memgym.evolution.search.proposers.params import constant_mutations
from memgym.evolution.search.select import RandomCases, RoundRobinTarget, TaskInfo
from memgym.evolution.search.strategies import BestOverallParent, LowestScoreCases, strategy_for
from memgym.memory_bank.programs import read_program_source, seed_program_path

SEED = read_program_source(seed_program_path())


# ------------------------------------------------------------------ acceptance with delta

BASE_CAPS = {"F": 0.60, "T": 0.40, "M": 0.50}


def test_merge_that_raises_overall_but_drops_one_capability_beyond_delta_is_rejected():
    ok, reason, drops = integration_verdict(0.56, {"F": 0.57, "T": 0.55, "M": 0.50}, 0.50, BASE_CAPS, 0.02)
    assert not ok and reason == "capability F drops 0.0300 > delta 0.02 against the base"
    assert drops == pytest.approx({"F": 0.03})
    # two capabilities beyond delta: the worst is named, the other listed
    ok, reason, _ = integration_verdict(0.60, {"F": 0.50, "T": 0.90, "M": 0.45}, 0.50, BASE_CAPS, 0.02)
    assert not ok and reason == "capability F drops 0.1000 > delta 0.02 against the base (also M)"


def test_merge_within_delta_is_accepted_and_overall_must_beat_the_base():
    # F drops exactly delta (0.60 -> 0.58), M 0.01: both allowed
    ok, reason, drops = integration_verdict(0.55, {"F": 0.58, "T": 0.55, "M": 0.49}, 0.50, BASE_CAPS, 0.02)
    assert ok and reason == "" and drops == pytest.approx({"F": 0.02, "M": 0.01})
    # same table, larger delta tolerance: still accepted; smaller: rejected
    assert integration_verdict(0.55, {"F": 0.58, "T": 0.55, "M": 0.49}, 0.50, BASE_CAPS, 0.05)[0]
    assert not integration_verdict(0.55, {"F": 0.58, "T": 0.55, "M": 0.49}, 0.50, BASE_CAPS, 0.015)[0]
    ok, reason, _ = integration_verdict(0.50, {"F": 0.60, "T": 0.40, "M": 0.50}, 0.50, BASE_CAPS, 0.02)
    assert not ok and reason == "valid overall 0.5000 does not beat the base's 0.5000"
    # a capability missing from the merged scores counts as 0
    assert integration_verdict(0.9, {"F": 0.9, "T": 0.9}, 0.5, BASE_CAPS)[1].startswith("capability M drops 0.5000")


def _cand(cid, train, valid_caps=None, overall=0.0, parent="seed"):
    c = Candidate(cid, None if cid == "seed" else parent, 0, "seed", None, "test", status="evaluated", key=cid)
    c.train = SplitScores(0.0, {}, train)
    c.valid = SplitScores(overall, valid_caps or {}, {})
    return c


def test_blame_names_the_contributor_weakest_on_the_dropped_capability():
    a = _cand("a", {}, {"F": 0.7, "T": 0.2}, 0.5)
    b = _cand("b", {}, {"F": 0.4, "T": 0.6}, 0.6)
    assert blame([a, b], {"F": 0.05, "T": 0.01}, 0.02) == "b"  # F dropped most: b is weakest on F
    assert blame([a, b], {"T": 0.05}, 0.02) == "a"
    assert blame([a, b], {"F": 0.01}, 0.02) == "a"  # nothing beyond delta: lowest valid overall
    assert blame([], {}, 0.02) is None


# ------------------------------------------------------------------ paired differential cases

TRAIN = [TaskInfo("c/t1", "train", "T"), TaskInfo("c/t2", "train", "T"), TaskInfo("c/t3", "train", "T"),
         TaskInfo("c/f1", "train", "F"), TaskInfo("c/f2", "train", "F"), TaskInfo("c/m1", "train", "M")]


def _paired_archive():
    arch = Archive()
    arch.add(_cand("seed", {"c/t1": 0.2, "c/t2": 0.0, "c/t3": 0.5, "c/f1": 1.0, "c/f2": 0.5, "c/m1": 0.3}))
    # T specialist: gaps t1 +0.6, t2 +0.8, t3 +0.8 (tie with t2: the earlier task wins); also +1.0 on m1 (not T)
    arch.add(_cand("x", {"c/t1": 0.8, "c/t2": 0.8, "c/t3": 1.0, "c/f1": 1.0, "c/f2": 0.5, "c/m1": 1.0}))
    # F specialist never beats the base on an F task: gaps f1 -0.5, f2 -0.25 -> f2 (the largest, negative)
    arch.add(_cand("y", {"c/t1": 0.2, "c/t2": 0.0, "c/t3": 0.5, "c/f1": 0.5, "c/f2": 0.25, "c/m1": 0.3}))
    arch.base, arch.specialists = "seed", {"F": "y", "T": "x", "M": "seed"}
    return arch


def test_paired_differential_case_choice_exact():
    arch = _paired_archive()
    assert paired_case(arch, "T", TRAIN) == ("c/t2", pytest.approx(0.8))
    assert paired_case(arch, "F", TRAIN) == ("c/f2", pytest.approx(-0.25))
    assert paired_case(arch, "M", TRAIN) is None  # M's specialist is the base
    assert paired_case(arch, "P", TRAIN) is None  # no specialist, no P task
    got = paired_cases(arch, TRAIN)
    assert list(got) == ["F", "T"]
    assert got["T"] == {"task": "c/t2", "gap": pytest.approx(0.8), "specialist": "x"}
    assert list(paired_cases(arch, TRAIN, only={"x"})) == ["T"]
    # random_cases ablation: drawn with the run's seeded RNG over all train tasks, in F, T order
    rng, ref = random.Random(7), random.Random(7)
    drawn = paired_cases(arch, TRAIN, rng, random_draw=True)
    ids = [t.id for t in TRAIN]
    assert [drawn["F"]["task"], drawn["T"]["task"]] == [ref.choice(ids), ref.choice(ids)]


# ------------------------------------------------------------------ component-level merge

BASE, _ = variant("dense_ranking").apply(SEED)
SPEC_T, _ = variant("time_hint").apply(BASE)
SPEC_F, _ = variant("hybrid_lexical").apply(BASE)
SPEC_A, _ = variant("answer_abstain").apply(BASE)
SPEC_P = apply_edits(BASE, [next(e for d, e in constant_mutations(BASE) if d == "constant TOP_K: 40 -> 20")])


def _merge(t_scores, f_scores):
    specs = [Contender("sT", SPEC_T, "T", t_scores), Contender("sF", SPEC_F, "F", f_scores),
             Contender("sA", SPEC_A, "A"), Contender("sP", SPEC_P, "P"), Contender("seed", SEED, "M")]
    ancestors = {"sT": BASE, "sF": BASE, "sA": BASE, "sP": BASE, "seed": SEED}  # seed: an ancestor of the base
    return component_merge(Contender("base", BASE), specs, ancestors, {"T": "t-case", "F": "f-case"})


def test_component_merge_takes_each_component_from_the_specialist_that_changed_it():
    from memgym.evolution.execution.validate import ValidationLimits, validate_program

    res = _merge({"t-case": 1.0, "f-case": 0.0}, {"t-case": 0.5, "f-case": 1.0})
    prov = res.provenance
    assert prov["ANSWER_INSTRUCTION"] == "sA" and prov["TOP_K"] == "sP"
    assert {prov[k] for k in ("LEXICAL_WEIGHT", "STOPWORDS", "def word_tokens", "def lexical_overlap")} == {"sF"}
    # T's helpers lost with its retrieve: nothing uses them, so they are dropped (not dead code)
    assert not {"TIME_BONUS", "MONTHS", "def time_hints", "def time_match"} & set(prov)
    assert prov["Memory.index"] == "base" and prov["class MemoryUnit"] == "base"
    # both T and F changed Memory.retrieve: no train overall given, so settled on the mean over all
    # the merge's paired cases, F 0.75 vs T 0.5
    (conf,) = res.conflicts
    assert conf.key == "Memory.retrieve" and conf.component == "retrieval" and conf.cases == ["f-case", "t-case"]
    assert conf.rule == "paired cases"
    assert conf.versions == [{"holders": ["sT"], "score": 0.5, "paired": 0.5},
                             {"holders": ["sF"], "score": 0.75, "paired": 0.75}]
    assert conf.winner == "sF" and prov["Memory.retrieve"] == "sF"
    assert prov["import re"] == "sT"  # both added it; the first specialist's copy is taken
    assert res.components == {"shared": ["sT", "sF", "sP"], "answer": ["sA"], "retrieval": ["sF"]}
    assert res.contributors == ["sT", "sF", "sA", "sP"]  # the seed (an ancestor of the base) gives nothing
    src = res.source
    assert "TOP_K = 20\n" in src and "scores = scores + LEXICAL_WEIGHT * lexical_overlap(" in src
    assert "def time_match(" not in src and "Check that the memory really supports" in src
    assert src.count("import re\n") == 1 and src.index("import re\n") < src.index("def word_tokens(")
    verdict = validate_program(src, BASE, ValidationLimits(probe_units=200, probe_batches=10))
    assert verdict.ok, verdict.to_dict()
    # the other way round on the paired cases: T's retrieve wins, and the program is valid too
    res2 = _merge({"t-case": 1.0, "f-case": 1.0}, {"t-case": 0.0, "f-case": 0.5})
    assert res2.provenance["Memory.retrieve"] == "sT" and "TIME_BONUS * time_match(text" in res2.source
    assert "def word_tokens(" not in res2.source and "def time_hints(" in res2.source
    assert validate_program(res2.source, BASE, ValidationLimits(probe_units=200, probe_batches=10)).ok


def test_merge_of_one_specialist_is_that_specialist_and_bad_programs_raise():
    from memgym.evolution.search.archive import program_key

    res = component_merge(Contender("base", BASE), [Contender("sT", SPEC_T, "T")], {"sT": BASE})
    assert program_key(res.source) == program_key(SPEC_T) and res.conflicts == []
    # statement order does not change the element key (the program key sees it)
    moved = SPEC_T.replace("TOP_K = 40\n", "", 1).replace("def pack_lines(", "TOP_K = 40\n\n\ndef pack_lines(")
    assert moved != SPEC_T and element_key(moved) == element_key(SPEC_T) != element_key(BASE)
    assert program_key(moved) != program_key(SPEC_T)
    with pytest.raises(MergeError, match="sX: syntax error"):
        component_merge(Contender("base", BASE), [Contender("sX", "def (", "T")], {"sX": BASE})
    with pytest.raises(MergeError, match="no class Memory"):
        split_program("X = 1\n", "p")
    with pytest.raises(MergeError, match="no common ancestor given for specialist sT"):
        component_merge(Contender("base", BASE), [Contender("sT", SPEC_T, "T")], {})


# ------------------------------------------------------------------ ablation policies

VALID5 = [TaskInfo(f"v{c}", "valid", c) for c in "ATMPF"]


def test_round_robin_targets_f_t_p_m_a_in_turn():
    arch = Archive()
    pol, got = RoundRobinTarget(), []
    for r in range(1, 7):
        c = pol.choose(arch, VALID5, r, random.Random(0))
        arch.selections[c] = arch.selections.get(c, 0) + 1  # what the loop does after choosing
        got.append(c)
    assert got == ["F", "T", "P", "M", "A", "F"]


def test_random_cases_draw_with_the_seeded_rng():
    tasks = [TaskInfo(f"c/q{i}", "train", "FTPMA"[i % 5]) for i in range(20)]
    parent = _cand("p", {t.id: 0.0 for t in tasks})
    got = RandomCases().choose(Archive(), parent, "T", tasks, 5, random.Random(3))
    assert got == random.Random(3).sample([t.id for t in tasks], 5)
    assert got != RandomCases().choose(Archive(), parent, "T", tasks, 5, random.Random(4))


def test_holistic_parent_and_cases_use_overall_scores_only():
    arch = Archive()
    arch.add(_cand("seed", {}, overall=0.4))
    arch.add(_cand("a", {}, overall=0.6))
    arch.add(_cand("b", {}, overall=0.6))  # tie: the earlier one
    assert BestOverallParent().choose(arch, None).id == "a"
    tasks = [TaskInfo("q1", "train", "F"), TaskInfo("q2", "train", "T"), TaskInfo("q3", "train", None),
             TaskInfo("q4", "train", "M")]
    parent = _cand("p", {"q1": 0.5, "q2": 0.0, "q3": 0.0, "q4": 1.0})
    assert LowestScoreCases().choose(arch, parent, None, tasks, 3, random.Random(0)) == ["q2", "q3", "q1"]


def test_ablation_configs_and_classes(tmp_path):
    base = dict(train=["conv-26"], valid=["conv-30"], rounds_cold=2, rounds_refine=3, rounds_integrate=2,
                progress=False, out=str(tmp_path / "r"))
    hol = strategy_for("holistic").run_config(EvolveConfig(**base, ablation="holistic"))
    assert (hol.rounds_cold, hol.rounds_refine, hol.rounds_integrate) == (7, 0, 0)
    noi = strategy_for("no_integration").run_config(EvolveConfig(**base, ablation="no_integration"))
    assert (noi.rounds_cold, noi.rounds_refine, noi.rounds_integrate) == (2, 3, 0)
    with pytest.raises(ValueError, match="--ablation: 'greedy' is not one of none, holistic, round_robin"):
        EvolveConfig(**base, ablation="greedy")
    with pytest.raises(ValueError, match="unknown ablation 'greedy'; choose from none, holistic"):
        strategy_for("greedy")
    with pytest.raises(ValueError, match="delta must be in"):
        EvolveConfig(**base, delta=1.5)
    evo = build_engine(EvolveConfig(**base, ablation="holistic"))
    assert evo.integrator is None and not evo.strategy.specialists
    assert evo.stage_of(1) == evo.stage_of(7) == "holistic" and evo.cfg.total_rounds == 7
    assert type(evo.strategy.parent).__name__ == "BestOverallParent"
    assert type(evo.strategy.acceptance).__name__ == "OverallAcceptance"
    evo = build_engine(EvolveConfig(**{**base, "out": str(tmp_path / "r2")}, ablation="round_robin"))
    assert type(evo.strategy.target).__name__ == "RoundRobinTarget" and evo.integrator is not None
    assert [evo.stage_of(r) for r in range(1, 8)] == ["cold"] * 2 + ["refine"] * 3 + ["integrate"] * 2
    evo = build_engine(EvolveConfig(**{**base, "out": str(tmp_path / "r3")}, ablation="random_cases"))
    assert type(evo.strategy.cases).__name__ == "RandomCases" and evo.integrator.random_cases
    evo = build_engine(EvolveConfig(**{**base, "out": str(tmp_path / "r4")}, ablation="no_integration"))
    assert evo.integrator is None and evo.cfg.total_rounds == 5
