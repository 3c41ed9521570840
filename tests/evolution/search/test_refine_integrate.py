"""Issue 20's evolution-algorithm fixes on hand-made archives and traces: the parent fallback, the
budget-cut share and the weight it gives ``rank_order``, the element-level merge retry and
merges onto an accepted merge."""
from __future__ import annotations

import json
import random
from types import SimpleNamespace

import pytest

from memgym.evolution.search.archive import Archive, Candidate, SplitScores, program_key
from memgym.evolution.search.budget_cut import evidence_cut
from memgym.evolution.search.edits import apply_edits
from memgym.evolution.search.integrate import RoundSteps, TraceGuidedIntegrator, blame_elements
from memgym.evolution.search.engine import Engine
from memgym.evolution.search.proposers.base import ProposalInput
from memgym.evolution.search.proposers.library import LIBRARY, variant
from memgym.evolution.search.proposers.params import ParamsProposer, _variant_weight, constant_mutations
from memgym.evolution.search.select import SpecialistParent, TaskInfo
from memgym.memory_bank.programs import read_program_source, seed_program_path

from tests.evolution.search.booking import Booking

SEED = read_program_source(seed_program_path())
DENSE, _ = variant("dense_ranking").apply(SEED)
HYBRID, _ = variant("hybrid_lexical").apply(DENSE)
HYBRID_K20 = apply_edits(HYBRID, [next(e for d, e in constant_mutations(HYBRID) if d == "constant TOP_K: 40 -> 20")])
TIMED, _ = variant("time_hint").apply(DENSE)


def _cand(cid, parent, overall, caps, train=None, stage="refine"):
    c = Candidate(cid, parent, 0, stage, None, "test", status="evaluated")
    c.train = SplitScores(overall, dict(caps), dict(train or {}))
    c.valid = SplitScores(overall, dict(caps), {})
    return c


# ------------------------------------------------------------------ (b) budget cut


def _run(probes: dict, tasks: list):
    """A ProgramRun look-alike: one conversation c1 with turns t1..t3."""
    turns = {"t1": "Caroline went to the LGBTQ support group on Monday",
             "t2": "Melanie painted a sunrise over the lake last year",
             "t3": "Caroline is researching adoption agencies"}
    conv = SimpleNamespace(id="c1", turn_index={k: (1, SimpleNamespace(text=v, image_caption=None))
                                                for k, v in turns.items()})
    tr = SimpleNamespace(conversation=conv, probes=probes)
    ts = [SimpleNamespace(conversation="c1", qa=SimpleNamespace(evidence=ev, capability=SimpleNamespace(value=cap)))
          for cap, ev in tasks]
    return SimpleNamespace(traces=[tr], tasks=ts)


class _Chars:
    """A budget of ``n`` characters (cut = prefix)."""

    def __init__(self, n):
        self.n = n

    def cut(self, text):
        return text[:self.n]


def test_evidence_cut_counts_found_evidence_the_budget_removes():
    filler = "x" * 100
    probes = {"t1": "[2023] Caroline: Caroline went to the LGBTQ support group on Monday\n" + filler,  # first: kept
              "t2": filler + "\n[2022] Melanie painted a sunrise over the lake last year",  # after 100 chars: cut
              "t3": filler}  # not retrieved for itself: not found
    run = _run(probes, [("T", ["t1", "t2"]), ("T", ["t2", "t2"]), ("F", ["t3", "t1"]), ("F", ["t9"])])
    got = evidence_cut(run, _Chars(90))
    # T: task 1 finds t1 (kept) and t2 (cut); task 2 finds t2 once (cut) -> 3 found, 2 cut
    assert got["T"] == {"found": 3, "cut": 2, "share": pytest.approx(2 / 3)}
    # F: t3 not found, t1 found and kept; t9 is not a turn
    assert got["F"] == {"found": 1, "cut": 0, "share": 0.0}
    assert got["overall"] == {"found": 4, "cut": 2, "share": 0.5}
    assert evidence_cut(run, _Chars(10_000))["overall"]["cut"] == 0
    assert evidence_cut(run, None) is None
    assert evidence_cut(_run({}, [("T", ["t1"])]), _Chars(5)) is None  # no probes: no diagnostics run


def _weights(source, target, diag):
    inp = ProposalInput(source, "p", "refine", target, diag, [], [], [], [])
    return {v.name: _variant_weight(v, inp) for v in LIBRARY if v.component != "answer"}


def test_rank_order_is_weighed_by_the_measured_budget_cut_not_its_hand_tag():
    row = {"d_ext": 0.8, "d_ret": 0.7, "d_idx": 0.8}  # retrieval factor 1 + 4 * 0.1 = 1.4
    w = _weights(DENSE, "A", {"A": {**row, "budget_cut": 0.5}, "overall": {"answered": False}})
    assert w["rank_order"] == pytest.approx(3.0 * (1 + 4 * 0.5))  # 9.0: tagged A by its effect
    assert w["hybrid_lexical"] == pytest.approx(3.0 * 1.4)  # tagged FPA by hand
    assert w["mmr"] == pytest.approx(0.5 * 1.4)
    # a small measured cut: not tagged for the target ("*" stays), weighed 1 + 4 * 0.1
    w = _weights(DENSE, "A", {"A": {**row, "budget_cut": 0.1}})
    assert w["rank_order"] == pytest.approx(1.5 * 1.4)
    # nothing measured (no budget): the hand tag and the retrieval factor, as before
    w = _weights(DENSE, "A", {"A": row})
    assert w["rank_order"] == pytest.approx(1.5 * 1.4)
    # the target row lacks the measurement: the overall row's is used
    w = _weights(DENSE, "T", {"T": row, "overall": {"budget_cut": 0.25}})
    assert w["rank_order"] == pytest.approx(3.0 * 2.0)


# ------------------------------------------------------------------ (a) parent fallback


def _fallback_engine(arch, sources, known):
    proposer = ParamsProposer()

    def build_input(round_no, stage, parent, target, case_ids):
        return ProposalInput(sources[parent.id], parent.id, stage, target, {}, [], [], [], [], frozenset(known))

    return SimpleNamespace(proposer=proposer, strategy=SimpleNamespace(parent=SpecialistParent()),
                           state=SimpleNamespace(archive=arch),
                           build_input=build_input)


def _children(source):
    inp = ProposalInput(source, "p", "refine", "A", {}, [], [], [], [])
    lib, mut = ParamsProposer().options(inp)
    return {program_key(o[2]) for _, o in lib + mut}


def test_parent_fallback_refines_the_best_overall_program_when_the_specialist_is_exhausted():
    arch = Archive()
    arch.add(_cand("seed", None, 0.30, {"A": 0.50, "F": 0.3}, stage="seed"))
    arch.add(_cand("r03", "seed", 0.44, {"A": 0.35, "F": 0.6}))
    arch.add(_cand("r05", "seed", 0.46, {"A": 0.33, "F": 0.55}))
    arch.base, arch.specialists = "r05", {"A": "seed", "F": "r03"}
    sources = {"seed": SEED, "r03": DENSE, "r05": TIMED}
    eng = _fallback_engine(arch, sources, _children(SEED))
    # A's specialist is the seed, and every child of the seed is archived: r05 (best overall) is refined
    assert Engine.fallback_parent(eng, arch.get("seed"), "A").id == "r05"
    # r05 exhausted too: the next best overall, r03
    eng = _fallback_engine(arch, sources, _children(SEED) | _children(TIMED))
    assert Engine.fallback_parent(eng, arch.get("seed"), "A").id == "r03"
    # the specialist still has options: it stays the parent
    eng = _fallback_engine(arch, sources, set())
    assert Engine.fallback_parent(eng, arch.get("seed"), "A").id == "seed"
    # everything exhausted: the specialist (the proposer then says so)
    eng = _fallback_engine(arch, sources, _children(SEED) | _children(TIMED) | _children(DENSE))
    assert Engine.fallback_parent(eng, arch.get("seed"), "A").id == "seed"
    assert [c.id for c in SpecialistParent().fallbacks(arch, "A")] == ["r05", "r03"]
    assert SpecialistParent().fallbacks(arch, None) == []


def test_a_parent_fallback_is_booked_once_in_the_round_record_its_outcome_and_the_report(tmp_path):
    """The round record is complete when it is written: outcome.json and state.json's history hold
    the same record, with the parent first chosen; report.md's row says so."""
    from memgym.evolution.search.config import EvolveConfig
    from memgym.evolution.search.report import round_rows
    from memgym.evolution.search.state import EvolutionState

    state = EvolutionState(EvolveConfig(train=["conv-26"], valid=["conv-30"], n_sessions=1, max_questions=2,
                                        embedder="hash:64", out=str(tmp_path / "run")))
    seed, r03 = _cand("seed", None, 0.30, {"A": 0.50}, stage="seed"), _cand("r03", "seed", 0.44, {"A": 0.35})
    r05 = _cand("r05", "r03", 0.40, {"A": 0.45})
    r05.round, r05.description, r05.validation = 5, "variant dense_ranking", {"ok": True, "level": 4}
    for c in (seed, r03, r05):
        state.archive.add(c)
    state.archive.base, state.archive.specialists = "seed", {"A": "seed"}
    state.sources.update(seed=SEED, r03=DENSE, r05=TIMED)
    state.record_round(5, "refine", "A", r03, r05, "", fallback_from="seed")
    state.save()
    outcome = json.loads((tmp_path / "run" / "candidates" / "r05" / "outcome.json").read_text())
    assert outcome == json.loads((tmp_path / "run" / "state.json").read_text())["history"][-1] == {
        "round": 5, "stage": "refine", "target": "A", "parent": "r03", "candidate": "r05",
        "proposal": "variant dense_ranking", "accepted": "no: no capability's valid score improved", "base": "seed",
        "specialists": {"A": "seed"}, "fallback_from": "seed"}
    assert (tmp_path / "run" / "candidates" / "r05" / "program.py").read_text() == TIMED
    row = round_rows(state)[-1]
    assert row["proposal"] == "[parent fallback: seed has nothing left to try] variant dense_ranking"
    assert (row["status"], row["verdict"], row["valid"], row["tokens"]) == ("evaluated", "ok", r05.valid.scores(), 0)
    assert state.archive.attempts == {"A": ["r05"]}


# ------------------------------------------------------------------ (c) element-level retry


TRAIN = [TaskInfo("c/f1", "train", "F"), TaskInfo("c/t1", "train", "T")]


def _integration_archive():
    arch = Archive()
    arch.add(_cand("seed", None, 0.30, {"F": 0.30, "T": 0.10}, {"c/f1": 0.0, "c/t1": 0.0}, stage="seed"))
    arch.add(_cand("r01", "seed", 0.40, {"F": 0.50, "T": 0.20}, {"c/f1": 0.5, "c/t1": 0.2}, stage="cold"))
    arch.add(_cand("r02", "r01", 0.46, {"F": 0.50, "T": 0.45}, {"c/f1": 0.5, "c/t1": 1.0}))  # T: time_hint
    arch.add(_cand("r03", "r01", 0.43, {"F": 0.62, "T": 0.20}, {"c/f1": 0.8, "c/t1": 0.2}))  # F: hybrid (+0.12 F)
    arch.add(_cand("r04", "r03", 0.44, {"F": 0.66, "T": 0.12}, {"c/f1": 1.0, "c/t1": 0.2}))  # TOP_K 20 (T -0.08)
    # r04 is better than r02 on train overall (0.48 > 0.46), though not on valid: the Memory.retrieve
    # conflict between them (hybrid vs time_hint) is settled on train overall and goes to r04
    arch.get("r04").train.overall = 0.48
    arch.base, arch.specialists = "r01", {"F": "r04", "T": "r02"}
    return arch


SOURCES = {"seed": SEED, "r01": DENSE, "r02": TIMED, "r03": HYBRID, "r04": HYBRID_K20}


def test_blame_elements_picks_the_worst_lineage_step_of_the_blamed_specialist():
    arch = _integration_archive()
    supplied = {"TOP_K", "LEXICAL_WEIGHT", "STOPWORDS", "def word_tokens", "def lexical_overlap", "Memory.retrieve"}
    # T dropped: r04's step (TOP_K 40 -> 20, T -0.08) is worse than r03's (T +0.00)
    assert blame_elements(arch, SOURCES.get, "r04", "r01", supplied, "T") == ("r04", ["TOP_K"])
    # F dropped: r03 gained F +0.12, r04 +0.04: r04 is still the worst step
    assert blame_elements(arch, SOURCES.get, "r04", "r01", supplied, "F") == ("r04", ["TOP_K"])
    # TOP_K not supplied (the base's version won): r03's elements are left out
    got = blame_elements(arch, SOURCES.get, "r04", "r01", supplied - {"TOP_K"}, None)
    assert got == ("r03", ["LEXICAL_WEIGHT", "Memory.retrieve", "STOPWORDS", "def lexical_overlap", "def word_tokens"])
    assert blame_elements(arch, SOURCES.get, "r04", "r01", set(), None) is None


class _State(Booking):
    """What the integrator reads of the run state (no run directory)."""

    def __init__(self, arch):
        self.archive, self.history, self.sources = arch, [], dict(SOURCES)

    def source_of(self, cid):
        return self.sources[cid]

    def split_tasks(self, split):
        return TRAIN


def _steps(state, scores):
    """An attempt that archives the proposed merge with the scripted valid scores of its round."""

    def attempt(round_no, stage, parent, target, inp, cid, proposer=None):
        src = proposer.propose(inp, random.Random(0)).source
        overall, caps = scores[round_no]
        c = _cand(cid, parent.id, overall, caps, {"c/f1": 0.9, "c/t1": 0.9}, stage="integrate")
        c.round, c.key = round_no, program_key(src)
        state.sources[cid] = src
        state.archive.add(c)
        return c

    return RoundSteps(attempt, lambda source, ids: [], "params")


def test_element_level_retry_then_the_remaining_changes_go_onto_the_accepted_merge():
    arch = _integration_archive()
    state = _State(arch)
    integ = TraceGuidedIntegrator(0.02, onto="best")
    scores = {7: (0.47, {"F": 0.66, "T": 0.40}),  # T drops 0.05 against the anchor r02: rejected
              8: (0.49, {"F": 0.62, "T": 0.45})}  # without r04's TOP_K: accepted
    steps = _steps(state, scores)
    integ.run_round(state, steps, 7, random.Random(0))
    r7 = state.archive.integrations[-1]
    assert r7.anchor == "r02" and r7.candidate == "r07" and not r7.integrated
    assert r7.blamed == "r04" and r7.blamed_step == "r04" and r7.left_out == [["r04", "TOP_K"]]
    assert (state.history[-1].parent, state.history[-1].candidate, state.history[-1].accepted) == \
        ("r02", "r07", r7.accepted)
    assert "TOP_K = 20" in state.sources["r07"] and "def lexical_overlap(" in state.sources["r07"]
    # round 8: r04 still contributes (its hybrid scoring), only its TOP_K is left out
    integ.run_round(state, steps, 8, random.Random(0))
    r8 = state.archive.integrations[-1]
    assert r8.merged_from == ["r04 (F)"] and r8.excluded == [["r04", "TOP_K"]]
    assert "TOP_K = 40" in state.sources["r08"] and "def lexical_overlap(" in state.sources["r08"]
    assert "def time_match(" in state.sources["r08"] and r8.integrated
    # round 9: onto the accepted merge r08, the exclusions start afresh: r04's TOP_K is offered again;
    # r08 + TOP_K 20 is r07 up to statement order, so r07's scores are reused, judged against r08
    assert integ.anchor(state).id == "r08"
    integ.run_round(state, steps, 9, random.Random(0))
    r9, row9 = state.archive.integrations[-1], state.history[-1]
    assert r9.anchor == "r08" and row9.parent == "r08" and r9.candidate == row9.candidate == "r07"
    assert row9.proposal.endswith("onto r08 = archived r07 (scores reused)") and not r9.integrated
    assert r9.accepted == row9.accepted
    assert r9.accepted.startswith("no: valid overall 0.4700 does not beat the base's 0.4900")
    assert r9.left_out == [["r04", "TOP_K"]]
    assert integ.final(state) == "r08"
    # round 10: nothing of r04 is left to add onto r08
    integ.run_round(state, steps, 10, random.Random(0))
    assert state.history[-1].accepted.startswith("skipped: the specialists add nothing to the accepted merge r08")


# ------------------------------------------------------------------ (d) the proposer reads the cases


def _case(question, answer):
    return f"## Case c/q [T] score 0.00\nQuestion: {question}\nReference answer: {answer}\nPrediction: -\nRetrieved:\n..."


def test_time_hint_and_date_words_are_weighed_by_what_the_cases_say():
    cases = [_case("What did Caroline do in May 2023?", "went to a support group"),
             _case("When did Melanie paint a sunrise?", "2022"),
             _case("When did Caroline go to the LGBTQ support group?", "7 May 2023"),
             _case("Which day did Mel run a charity race?", "the Sunday before 25 May 2023")]
    diag = {"T": {"d_ext": 0.8, "d_ret": 0.7, "d_idx": 0.8}}  # retrieval 1.4, indexing 1.0
    inp = ProposalInput(DENSE, "p", "refine", "T", diag, cases, ["c/q"] * 4, [], [])
    w = {v.name: _variant_weight(v, inp) for v in LIBRARY if v.component != "answer"}
    # time_hint: 1 of 4 questions names a month with a year -> 0.25 + 0.75 * 2 * 0.25 = 0.625
    assert w["time_hint"] == pytest.approx(3.0 * 1.4 * 0.625)
    # date_words: 2 of 4 reference answers name a month or weekday ("May", "Sunday", "May") -> 1.0
    assert w["date_words"] == pytest.approx(3.0 * 1.0 * 1.0)
    # no case names a date: both down to the floor; without cases: unchanged
    plain = [_case("What does Mel like?", "painting")]
    w = {v.name: _variant_weight(v, ProposalInput(DENSE, "p", "refine", "T", diag, plain, ["c/q"], [], []))
         for v in LIBRARY if v.name in ("time_hint", "date_words", "mmr")}
    assert w == pytest.approx({"time_hint": 3.0 * 1.4 * 0.25, "date_words": 3.0 * 0.25, "mmr": 0.5 * 1.4})
    w = _weights(DENSE, "T", diag)
    assert (w["time_hint"], w["date_words"]) == pytest.approx((3.0 * 1.4, 3.0))


# ------------------------------------------------------------------ per-element merge base


def test_parallel_lineages_merge_without_pseudo_conflicts():
    """The demo's case: the base (seed -> date_words -> dense -> TOP_K 30) and a specialist (seed ->
    dense -> hybrid) both applied dense_ranking from the seed. Against their common ancestor (the
    seed) TOP_K and Memory.retrieve are conflicts settled on the specialist's paired case (so against
    the base); with per-element merge bases the base keeps its TOP_K and the specialist's hybrid
    retrieve is taken, with no conflict."""
    from memgym.evolution.search.merge import Contender, component_merge

    dated, _ = variant("date_words").apply(SEED)
    dated_dense, _ = variant("dense_ranking").apply(dated)
    base = apply_edits(dated_dense, [next(e for d, e in constant_mutations(dated_dense)
                                          if d == "constant TOP_K: 40 -> 30")])
    spec = Contender("s", HYBRID, "F", {"case": 1.0})
    old = component_merge(Contender("b", base), [spec], {"s": SEED}, {"F": "case"})
    assert [(c.key, c.winner) for c in old.conflicts] == [("TOP_K", "s"), ("Memory.retrieve", "s")]
    assert "TOP_K = 40" in old.source
    new = component_merge(Contender("b", base), [spec], {"s": SEED}, {"F": "case"},
                          lineages={"b": [SEED, dated, dated_dense, base], "s": [SEED, DENSE, HYBRID]})
    assert new.conflicts == [] and "TOP_K = 30" in new.source and "def lexical_overlap(" in new.source
    assert new.provenance["TOP_K"] == "b" and new.provenance["Memory.retrieve"] == "s"
    assert new.provenance["def date_words"] == "b" and new.components == {"retrieval": ["s"], "shared": ["s"]}
    assert new.source == apply_edits(base, variant("hybrid_lexical").edits_for(base))


def test_a_specialist_left_out_but_for_its_imports_adds_nothing():
    """Round 8 of the experiment's full/seed0: every named element of the date_words specialist was
    left out; its `import datetime` alone made a new program that was evaluated for nothing."""
    from memgym.evolution.search.merge import Contender, component_merge
    from memgym.evolution.search.integration_rules import step_elements

    dated, _ = variant("date_words").apply(SEED)
    keys = step_elements(SEED, dated)
    assert keys == {"MONTH_NAMES", "WEEKDAYS", "def date_words", "def render_unit"}
    res = component_merge(Contender("b", HYBRID), [Contender("s", dated, "T")], {"s": SEED},
                          exclude={("s", k) for k in keys}, lineages={"b": [SEED, DENSE, HYBRID], "s": [SEED, dated]})
    assert res.contributors == [] and res.source == HYBRID and "import datetime" not in res.source
    # not left out: the helpers and their import come along
    res = component_merge(Contender("b", HYBRID), [Contender("s", dated, "T")], {"s": SEED},
                          lineages={"b": [SEED, DENSE, HYBRID], "s": [SEED, dated]})
    assert res.contributors == ["s"] and "import datetime" in res.source and "def date_words(" in res.source
