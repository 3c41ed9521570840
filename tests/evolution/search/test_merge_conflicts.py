"""Fair settlement of base-vs-specialist conflicts (issue 20, cause 2 of the closing note): a
conflicting element is settled on the train evaluation of both programs as a whole (train
overall), not on the specialist's own paired case, which is chosen where the specialist beats
the base the most. Hand-made programs (the seed + dense_ranking, three TOP_K constants) and
hand-made train scores."""
from __future__ import annotations

import random

import pytest

from memgym.evolution.search.archive import Archive, Candidate, SplitScores, program_key
from memgym.evolution.search.edits import apply_edits
from memgym.evolution.search.integrate import RoundSteps, TraceGuidedIntegrator
from memgym.evolution.search.merge import Contender, component_merge
from memgym.evolution.search.proposers.library import variant
from memgym.evolution.search.proposers.params import constant_mutations
from memgym.evolution.search.select import TaskInfo
from memgym.memory_bank.programs import read_program_source, seed_program_path

from tests.evolution.search.booking import Booking

SEED = read_program_source(seed_program_path())
DENSE, _ = variant("dense_ranking").apply(SEED)  # TOP_K = 40


def _top_k(n: int) -> str:
    return apply_edits(DENSE, [next(e for d, e in constant_mutations(DENSE) if d == f"constant TOP_K: 40 -> {n}")])


K20, K80 = _top_k(20), _top_k(80)
TIMED, _ = variant("time_hint").apply(DENSE)


@pytest.mark.parametrize("spec_overall, winner, top_k", [(0.45, "base", "TOP_K = 20\n"),
                                                         (0.65, "sP", "TOP_K = 80\n")])
def test_a_conflict_goes_to_the_program_better_on_train_overall(spec_overall, winner, top_k):
    # base and P specialist both moved TOP_K on from their common ancestor (40): a real conflict.
    # On P's paired case the specialist scores 1.0 and the base 0.0 (the case is chosen so);
    # on the train overall the base scores 0.60.
    base = Contender("base", K20, "", {"p-case": 0.0}, 0.60)
    spec = Contender("sP", K80, "P", {"p-case": 1.0}, spec_overall)
    res = component_merge(base, [spec], {"sP": DENSE}, {"P": "p-case"})
    (conf,) = res.conflicts
    assert conf.key == "TOP_K" and conf.rule == "train overall" and conf.cases == ["p-case"]
    assert conf.versions == [{"holders": ["base"], "score": 0.60, "paired": 0.0},
                             {"holders": ["sP"], "score": spec_overall, "paired": 1.0}]
    assert conf.winner == winner and res.provenance["TOP_K"] == winner and top_k in res.source
    assert res.contributors == ([] if winner == "base" else ["sP"])


def test_without_train_overall_all_the_merges_paired_cases_count_and_the_base_scores_too():
    # sP changed TOP_K (conflict with the base's 20); sT changed only retrieve (no conflict).
    # Over both paired cases: base (0.0 + 1.0) / 2 = 0.5, sP (1.0 + 0.0) / 2 = 0.5 -> a tie, the
    # base's version. On P's case alone (the old rule) sP won 1.0 to 0.
    base = Contender("base", K20, "", {"p-case": 0.0, "t-case": 1.0})
    specs = [Contender("sT", TIMED, "T", {"p-case": 0.0, "t-case": 1.0}),
             Contender("sP", K80, "P", {"p-case": 1.0, "t-case": 0.0})]
    res = component_merge(base, specs, {"sT": DENSE, "sP": DENSE}, {"P": "p-case", "T": "t-case"})
    (conf,) = res.conflicts
    assert conf.rule == "paired cases" and conf.cases == ["t-case", "p-case"]
    assert [v["score"] for v in conf.versions] == [0.5, 0.5] and conf.winner == "base"
    assert "TOP_K = 20\n" in res.source and res.provenance["Memory.retrieve"] == "sT"
    # sP better over both cases: its TOP_K
    specs[1].paired_scores = {"p-case": 1.0, "t-case": 0.5}
    res = component_merge(base, specs, {"sT": DENSE, "sP": DENSE}, {"P": "p-case", "T": "t-case"})
    assert res.conflicts[0].winner == "sP" and "TOP_K = 80\n" in res.source


# ------------------------------------------------------------------ through the integrator

TRAIN = [TaskInfo("c/f1", "train", "F"), TaskInfo("c/p1", "train", "P")]
SOURCES = {"seed": SEED, "r01": DENSE, "r02": K20, "r03": K80}


def _cand(cid, parent, overall, train, stage="refine"):
    c = Candidate(cid, parent, 0, stage, None, "test", status="evaluated")
    c.train = SplitScores(sum(train.values()) / len(train), {"F": train["c/f1"], "P": train["c/p1"]}, dict(train))
    c.valid = SplitScores(overall, {"F": overall, "P": overall}, {})
    c.key = program_key(SOURCES[cid])
    return c


class _State(Booking):
    def __init__(self, arch):
        self.archive, self.history = arch, []

    def source_of(self, cid):
        return SOURCES[cid]

    def split_tasks(self, split):
        return TRAIN


def _run(r03_train):
    arch = Archive()
    arch.add(_cand("seed", None, 0.30, {"c/f1": 0.1, "c/p1": 0.1}, stage="seed"))
    arch.add(_cand("r01", "seed", 0.40, {"c/f1": 0.5, "c/p1": 0.1}, stage="cold"))
    arch.add(_cand("r02", "r01", 0.50, {"c/f1": 0.8, "c/p1": 0.2}))  # base: TOP_K 20
    arch.add(_cand("r03", "r01", 0.45, r03_train))  # P specialist: TOP_K 80
    arch.base, arch.specialists = "r02", {"F": "r02", "P": "r03"}
    state = _State(arch)

    def attempt(*a, **k):
        raise AssertionError("no new program: the merge is the base or the specialist")

    TraceGuidedIntegrator(0.02, onto="best").run_round(state, RoundSteps(attempt, lambda s, i: [], "params"), 5,
                                                        random.Random(0))
    return state.archive.integrations[-1], state.history[-1]


def test_the_integrator_settles_the_conflict_on_both_programs_train_overall():
    # r03 beats the base r02 by 0.7 on P's paired case c/p1 (0.9 vs 0.2), so the old rule gave it
    # TOP_K; on train overall r03 scores (0.0 + 0.9) / 2 = 0.45 < r02's (0.8 + 0.2) / 2 = 0.50
    row, rnd = _run({"c/f1": 0.0, "c/p1": 0.9})  # train overall 0.45 < the base's 0.50: the base's TOP_K 20
    assert row.paired["P"]["task"] == "c/p1" and row.paired["P"]["gap"] == pytest.approx(0.7)
    assert row.accepted.startswith("skipped: the specialists add nothing to r02") and rnd.accepted == row.accepted
    row, rnd = _run({"c/f1": 0.4, "c/p1": 0.9})  # train overall 0.65 > 0.50: r03's TOP_K 80, i.e. r03 itself
    (conf,) = row.conflicts
    assert conf["key"] == "TOP_K" and conf["rule"] == "train overall" and conf["winner"] == "r03"
    assert [v["score"] for v in conf["versions"]] == pytest.approx([0.50, 0.65])
    assert row.candidate == rnd.candidate == "r03" and rnd.proposal.endswith("= archived r03 (scores reused)")
