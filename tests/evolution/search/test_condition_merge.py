"""Condition-level merge (issue 20 § 3): the question reader's exact naive-Bayes weights, the
merged program's two sides, and a hand-made archive where the component merge fails on δ and
its condition-level form is accepted. The programs are the seed and the seed + ``date_words``
(the demo's T specialist's change); they run for real on a hand-made conversation, scored by
answer-recall of the retrieved text cut to a fixed context budget."""
from __future__ import annotations

import math
import random
from dataclasses import dataclass
from types import SimpleNamespace

import pytest

from memgym.evolution.search.archive import Archive, Candidate, SplitScores, program_key
from memgym.evolution.search.condition import QuestionReader, condition_merge, condition_plan
from memgym.evolution.search.elements import MergeError
from memgym.evolution.search.integrate import RoundSteps, TraceGuidedIntegrator
from memgym.evolution.search.proposers.library import variant
from memgym.evolution.search.select import TaskInfo
from memgym.memory_bank.programs import read_program_source, seed_program_path

from tests.evolution.search.booking import Booking

SEED = read_program_source(seed_program_path())
DATES, _ = variant("date_words").apply(SEED)  # [2023-05-08, Monday 8 May 2023] instead of [2023-05-08]

TRAIN_Q = [("When did Ann move?", "T"), ("When did Bob paint?", "T"), ("What does Ann like?", "M"),
           ("What did Bob buy?", "F")]


def _reader(caps="T"):
    return QuestionReader.train([q for q, _ in TRAIN_Q], [c for _, c in TRAIN_Q], caps)


def test_reader_weights_are_bernoulli_naive_bayes_by_hand():
    # 2 T questions, 2 others; words in >= 2 questions: when (2, 0), what (0, 2), did (2, 1), ann (1, 1),
    # bob (1, 1). Laplace: p(w|T) = (df + 1) / 4, p(w|not T) = (df + 1) / 4.
    # when: log(.75/.25) - log(.25/.75) = 2 log 3; what: -2 log 3; did: log(.75/.5) - log(.25/.5) = log 3;
    # ann, bob: 0. bias = log(2/2) + log(.25/.75) + log(.75/.25) + log(.25/.5) + 0 + 0 = -log 2.
    r = _reader()
    assert r.words == pytest.approx({"ann": 0.0, "bob": 0.0, "did": math.log(3), "what": -2 * math.log(3),
                                     "when": 2 * math.log(3)}, abs=1e-4)
    assert r.bias == pytest.approx(-math.log(2), abs=1e-4) and r.train_accuracy == 1.0 and r.n_train == 4
    # "When did Ann move to Paris?": -log 2 + 2 log 3 + log 3 > 0; "What did Bob paint?": -log 2 - log 3 < 0
    assert r.score("When did Ann move to Paris?") > 0 and not r.score("What did Bob paint?") > 0
    assert r.score("Who?") == pytest.approx(-math.log(2), abs=1e-4) and not r.score("Who?") > 0
    with pytest.raises(MergeError, match="0 questions of A"):
        QuestionReader.train([q for q, _ in TRAIN_Q], [c for _, c in TRAIN_Q], "A")


def test_plan_by_rule():
    assert condition_plan("specialist", "TM", ["M"]) == ("T", "merged")
    assert condition_plan("dropped", "T", ["M", "A"]) == ("MA", "base")
    assert condition_plan("specialist", "M", ["M"]) is None and condition_plan("none", "T", ["M"]) is None
    with pytest.raises(MergeError, match="integrate_condition must be one of"):
        condition_plan("routing", "T", ["M"])


# ------------------------------------------------------------------ the program, run for real

UNITS = ["Ann moved to Paris.", "Bob painted a sunset.", "Ann lived in Rome before Paris."]
SESSION = {"index": 1, "id": "s1", "date": "2023-05-08T10:00:00", "date_text": "8 May 2023"}
BUDGET = len("\n".join(f"[2023-05-08] {u}" for u in UNITS))  # the seed's three lines fit exactly
VALID = [("c/f", "F", "What did Bob paint?", "sunset"), ("c/t1", "T", "When did Ann move to Paris?", "8 May 2023"),
         ("c/t2", "T", "When did Bob paint a sunset?", "8 May 2023"),
         ("c/m", "M", "What cities has Ann lived in?", "Rome")]


def _run(source: str) -> dict[str, str]:
    """Task id → the retrieved text cut to BUDGET characters."""
    ns: dict = {}
    exec(compile(source, "program", "exec"), ns)  # noqa: S102 (test programs from the library)
    mem = ns["Memory"](None)
    mem.index([ns["MemoryUnit"](u) for u in UNITS], SESSION)
    return {tid: mem.retrieve(ns["Query"](q))[:BUDGET] for tid, _, q, _ in VALID}


def _scores(source: str) -> SplitScores:
    got = _run(source)
    tasks = {tid: float(ans in got[tid]) for tid, _, _, ans in VALID}
    caps = {}
    for tid, cap, _, _ in VALID:
        caps.setdefault(cap, []).append(tasks[tid])
    return SplitScores(sum(tasks.values()) / len(tasks), {c: sum(v) / len(v) for c, v in caps.items()}, tasks)


def test_both_sides_keep_their_own_behaviour():
    src = condition_merge(SEED, DATES, _reader(), "merged", base_id="seed", merged_id="r01")
    assert "class BaseMemory" in src and "class MergedMemory" in src and "def render_unit_base(" in src
    got = _run(src)
    assert got["c/t1"] == _run(DATES)["c/t1"]  # reads as T: the date-words side
    assert got["c/m"] == _run(SEED)["c/m"] == "\n".join(f"[2023-05-08] {u}" for u in UNITS)
    # the seed and the merge alone: answer recall per capability
    assert _scores(SEED).by_capability == {"F": 1.0, "T": 0.0, "M": 1.0}
    assert _scores(DATES).by_capability == {"F": 1.0, "T": 1.0, "M": 0.0}  # Rome is past the budget
    assert _scores(src).by_capability == {"F": 1.0, "T": 1.0, "M": 1.0}
    flipped = condition_merge(SEED, DATES, _reader(), "base")  # T questions get the seed's side
    assert _scores(flipped).by_capability == {"F": 1.0, "T": 0.0, "M": 0.0}


def test_differing_contract_elements_cannot_be_conditioned():
    other = SEED.replace("Give a short, direct answer.", "Answer in one word.")
    with pytest.raises(MergeError, match="ANSWER_INSTRUCTION differs between seed and r01"):
        condition_merge(SEED, other, _reader(), "merged", base_id="seed", merged_id="r01")


# ------------------------------------------------------------------ through the integrator

SOURCES = {"seed": SEED, "r01": DATES}


@dataclass
class _Q:
    question: str
    capability: object


class _State(Booking):
    def __init__(self, arch):
        self.archive, self.history, self.sources = arch, [], dict(SOURCES)
        self.splits = {"train": [SimpleNamespace(questions=[_Q(q, SimpleNamespace(value=c)) for q, c in TRAIN_Q])]}

    def source_of(self, cid):
        return self.sources[cid]

    def split_tasks(self, split):
        return [TaskInfo(f"c/{i}", "train", c) for i, (_, c) in enumerate(TRAIN_Q)]


def _cand(cid, parent, source, stage="refine", round_no=0):
    c = Candidate(cid, parent, round_no, stage, None, "test", status="evaluated")
    c.valid = _scores(source)
    c.train = SplitScores(c.valid.overall, dict(c.valid.by_capability), {f"c/{i}": 0.5 for i in range(4)})
    c.key = program_key(source)
    return c


def test_a_failed_merge_is_accepted_in_its_condition_level_form():
    arch = Archive()
    arch.add(_cand("seed", None, SEED, stage="seed"))  # valid F 1, T 0, M 1: overall 0.5
    arch.add(_cand("r01", "seed", DATES))  # T specialist: F 1, T 1, M 0: overall 0.75
    arch.base, arch.specialists = "seed", {"F": "seed", "T": "r01", "P": "seed", "M": "seed", "A": "seed"}
    state = _State(arch)
    made = []

    def attempt(round_no, stage, parent, target, inp, cid, proposer=None):
        res = proposer.propose(inp, random.Random(0))
        state.sources[cid] = res.source
        made.append(res.source)
        c = _cand(cid, parent.id, res.source, stage="integrate", round_no=round_no)
        state.archive.add(c)
        return c

    steps = RoundSteps(attempt, lambda s, i: [], "params")
    integ = TraceGuidedIntegrator(0.02, onto="base", condition="specialist")
    integ.run_round(state, steps, 5, random.Random(0))
    merge = state.archive.integrations[-1]  # r01 onto the seed is r01 itself: M drops 1.0 > 0.02
    assert merge.candidate == "r01" and merge.contributor_caps == "T" and merge.drops == {"M": 1.0}
    assert not merge.integrated and merge.accepted.startswith("no: capability M drops 1.0000 > delta 0.02")
    assert (state.history[-1].round, state.history[-1].accepted) == (5, merge.accepted)
    integ.run_round(state, steps, 6, random.Random(0))
    cond = state.archive.integrations[-1]
    assert cond.attempt == "condition" and cond.candidate == "r06" and cond.merged_side == "r01"
    assert cond.condition == {"rule": "specialist", "capabilities": "T", "on_match": "merged", "words": 5,
                                 "train_accuracy": 1.0}
    assert state.archive.get("r06").valid.by_capability == {"F": 1.0, "T": 1.0, "M": 1.0} and cond.integrated
    assert state.history[-1].accepted == cond.accepted == "integrated: the final program"
    assert integ.final(state) == "r06" and "class BaseMemory" in made[0]
    # the next round merges r01 onto r06: its changes (date_words, render_unit) are already in it
    integ.run_round(state, steps, 7, random.Random(0))
    assert state.history[-1].accepted == ("skipped: the specialists add nothing to the accepted merge r06 (every "
                                             "change is in it or was left out)")
