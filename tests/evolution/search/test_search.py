"""The search layer's pure parts: the target formula (pressure included), history-guided case
order, compact cases, strict SEARCH/REPLACE edits, no-op/duplicate checks, the ledger."""
from __future__ import annotations

import random

import pytest

from memgym.evolution.search.archive import Archive, Candidate, SplitScores, program_key
from memgym.evolution.search.cases import (BUDGET, OMIT, CaseMaterial, EvidenceView, _Sim, compact_text,
                                    render_compact, render_full)
from memgym.evolution.search.edits import Edit, EditError, apply_edits, parse_response
from memgym.evolution.search.ledger import BudgetExhausted, Ledger
from memgym.evolution.search.engine import precheck
from memgym.evolution.search.select import (DependencyAwareTarget, HistoryGuidedCases, RoundRobinTarget, TaskInfo, case_weight,
                                     pressure, record_cases, target_scores)
from memgym.llm.embeddings import HashEmbedder
from memgym.memory_bank.programs import read_program_source, seed_program_path

SEED = read_program_source(seed_program_path())


def _cand(cid, valid_tasks, valid_caps, train_tasks=None, parent=None):
    c = Candidate(cid, parent, 0, "seed", None, "test", status="evaluated", key=cid)
    c.valid = SplitScores(sum(valid_tasks.values()) / len(valid_tasks), valid_caps, valid_tasks)
    c.train = SplitScores(0.0, {}, train_tasks or {})
    return c


# ------------------------------------------------------------------ target formula


VALID = [TaskInfo("f1", "valid", "F", ("T",)), TaskInfo("f2", "valid", "F"), TaskInfo("f3", "valid", "F", ("T",)),
         TaskInfo("f4", "valid", "F"), TaskInfo("t1", "valid", "T"), TaskInfo("t2", "valid", "T"),
         TaskInfo("m1", "valid", "M", ("T",)), TaskInfo("m2", "valid", "M")]
BASE_SCORES = {"f1": 0.0, "f2": 1.0, "f3": 0.5, "f4": 1.0, "t1": 0.0, "t2": 1.0, "m1": 0.2, "m2": 0.9}


def _target_archive():
    arch = Archive()
    arch.add(_cand("seed", BASE_SCORES, {"F": 0.625, "T": 0.5, "M": 0.55}))
    arch.add(_cand("x", {**BASE_SCORES, "t1": 0.5}, {"F": 0.625, "T": 0.75, "M": 0.55}))
    arch.base, arch.specialists = "seed", {"F": "seed", "T": "x", "M": "seed"}
    arch.selections = {"F": 1}
    return arch


def test_pressure_and_target_formula_exact():
    # F-primary: 4 tasks, 2 list T as secondary (share 0.5); both failed ones (f1 0.0, f3 0.5) list T (share 1.0)
    assert pressure("T", "F", VALID, BASE_SCORES) == 0.5
    # M-primary: m1 (T, failed 0.2) and m2 (passed 0.9): 1.0 - 0.5
    assert pressure("T", "M", VALID, BASE_SCORES) == 0.5
    assert pressure("F", "T", VALID, BASE_SCORES) == 0.0 and pressure("M", "F", VALID, BASE_SCORES) == 0.0
    arch = _target_archive()
    # F: (1 - 0.625 + 0) / (1 + 1); T: (1 - 0.75 [specialist x] + 0.5) / 1; M: (1 - 0.55 + 0) / 1
    assert target_scores(arch, VALID) == pytest.approx({"F": 0.1875, "T": 0.75, "M": 0.45}, abs=1e-12)
    pol = DependencyAwareTarget()
    assert pol.choose(arch, VALID, 1, random.Random(0)) == "T"
    arch.selections["T"] = 2  # T: 0.75 / 3 = 0.25 < M 0.45
    assert target_scores(arch, VALID)["T"] == 0.25 and pol.choose(arch, VALID, 2, random.Random(0)) == "M"
    # round robin over the capabilities with valid tasks, by how many choices were made
    assert RoundRobinTarget().choose(arch, VALID, 1, random.Random(0)) == "F"  # 3 choices so far: F T M -> F


# ------------------------------------------------------------------ case selection


def test_history_guided_case_order_exact():
    train = [TaskInfo("a", "train", "T"), TaskInfo("b", "train", "T", ("M",)), TaskInfo("c", "train", "T"),
             TaskInfo("d", "train", "T"), TaskInfo("e", "train", "T"), TaskInfo("f", "train", "F")]
    p_scores = {"a": 0.0, "b": 0.5, "c": 0.8, "d": 1.0, "e": 0.3, "f": 0.0}
    arch = Archive()
    parent = _cand("p", {"v": 1.0}, {}, p_scores)
    arch.add(parent)
    arch.add(_cand("q", {"v": 1.0}, {}, {**p_scores, "e": 1.0}))  # q scored higher on e: a regression witness
    arch.case_usage = {"a": 2}
    arch.combo_usage = {"": 1}
    # w = (1 + g) / ((1 + u)(1 + v)): a 1/6, b 1, c 1/2, e 1.7/2; d (1.0 > 0.8) and f (primary F) are out
    assert case_weight(arch, parent, train[4]) == pytest.approx(0.85)
    assert case_weight(arch, parent, train[0]) == pytest.approx(1 / 6)
    pol = HistoryGuidedCases()
    assert pol.choose(arch, parent, "T", train, 5, random.Random(0)) == ["b", "e", "c", "a"]
    assert pol.choose(arch, parent, "T", train, 2, random.Random(0)) == ["b", "e"]
    record_cases(arch, ["b", "e"], {t.id: t for t in train})
    assert arch.case_usage == {"a": 2, "b": 1, "e": 1} and arch.combo_usage == {"": 2, "M": 1}
    # b now: 1 / (2 * 2) = 0.25; e: 1.7 / (2 * 3); c: 1 / 3; a: 1 / 9
    assert pol.choose(arch, parent, "T", train, 5, random.Random(0)) == ["c", "e", "b", "a"]
    # cold start (no target): failed tasks spread over capabilities F, T, ..., lowest score first
    assert pol.choose(arch, parent, None, train, 3, random.Random(0)) == ["f", "a", "e"]


# ------------------------------------------------------------------ compact cases


def _long_case():
    lines = [f"[2023-05-{1 + i % 28:02d}] Speaker{i % 3}: filler talk number {i} about weather and traffic jams"
             for i in range(300)]
    lines[137] = "[2023-05-18] Caroline: I went to the LGBTQ support group yesterday and it was powerful"
    turns = [f"[D4:{k}] Melanie: chatting about gardening tomatoes and the weekend plan {k}" for k in range(80)]
    turns[40] = "[D4:40] Caroline: I went to the LGBTQ support group yesterday and it was powerful"
    units = [f"Melanie: gardening note {k} tomatoes weekend" for k in range(150)]
    units[90] = "Caroline: I went to the LGBTQ support group yesterday and it was powerful"
    ev = EvidenceView("D4:40", "I went to the LGBTQ support group yesterday and it was powerful",
                      "Session 4 (8 May 2023)\n" + "\n".join(turns), units)
    return CaseMaterial("conv-26/q0", "F", ("T",), "What group did Caroline go to?", "LGBTQ support group",
                        "a book club", 0.0, {"question": "What group did Caroline go to?"}, "\n".join(lines), [ev])


def test_compact_case_keeps_evidence_respects_budget_and_source_order():
    emb = HashEmbedder(dim=256)
    case = _long_case()
    full = render_full(case)
    compact, stats = render_compact(case, emb)
    assert stats == {"evidence": 1, "best_unit_kept": 1}
    assert "* Caroline: I went to the LGBTQ support group" in compact
    assert len(compact) < len(full) / 3
    sim = _Sim(emb, [("What group did Caroline go to? LGBTQ support group", 1.0)])
    excerpt = compact_text(case.retrieved, sim)
    assert len(excerpt) <= BUDGET and OMIT in excerpt.splitlines()
    assert "[2023-05-18] Caroline: I went to the LGBTQ support group" in excerpt
    kept = [ln for ln in excerpt.splitlines() if ln != OMIT]
    original = case.retrieved.splitlines()
    positions = [original.index(ln) for ln in kept]
    assert positions == sorted(positions)  # source order restored
    # an omission marker sits exactly where lines were skipped
    marks = excerpt.splitlines()
    for a, b in zip(marks, marks[1:]):
        if a != OMIT and b != OMIT:
            assert original.index(b) == original.index(a) + 1
    # the transcript excerpt keeps its session header whole and the evidence turn
    src = compact_text(case.evidence[0].source, _Sim(emb, [(case.evidence[0].text, 1.0)]))
    assert len(src) <= BUDGET and "[D4:40] Caroline: I went to the LGBTQ support group" in src
    short = "a short text"
    assert compact_text(short, sim) == short
    assert render_compact(case, emb)[1]["best_unit_kept"] == sum(1 for ev in case.evidence if ev.units)


# ------------------------------------------------------------------ edits


PROG = "def f(x):\n    y = x + 1\n    return y\n\n\ndef g():\n    return 2\n"


def test_edits_exact_whitespace_tolerant_miss_and_noop():
    assert apply_edits(PROG, [Edit("    y = x + 1\n", "    y = x + 2\n")]) == PROG.replace("x + 1", "x + 2")
    # second try: whitespace-normalised line match (the coder re-indented and added trailing blanks)
    got = apply_edits(PROG, [Edit("  y  =  x + 1   \n  return y\n", "    return x * 3\n")])
    assert got == "def f(x):\n    return x * 3\n\n\ndef g():\n    return 2\n"
    with pytest.raises(EditError) as e:
        apply_edits(PROG, [Edit("def g():\n    return 3\n", "def g():\n    return 4\n")])
    assert "not found" in str(e.value) and e.value.block == 1
    assert "   6| def g():" in e.value.closest and "   7|     return 2" in e.value.closest
    with pytest.raises(EditError, match="occurs 2 times"):
        apply_edits(PROG + "    return y\n", [Edit("    return y\n", "    return 0\n")])
    with pytest.raises(EditError, match="change nothing"):
        apply_edits(PROG, [Edit("    return 2\n", "    return 2\n")])
    with pytest.raises(EditError, match="SEARCH is empty"):
        apply_edits(PROG, [Edit("  \n", "x\n")])
    # all-or-nothing: a failing second block leaves nothing applied (the caller gets the error)
    with pytest.raises(EditError) as e2:
        apply_edits(PROG, [Edit("    return 2\n", "    return 5\n"), Edit("nope\n", "x\n")])
    assert e2.value.block == 2


def test_parse_response_blocks_file_prose_and_broken():
    text = "Rank lines.\n<<<<<<< SEARCH\n    return 2\n=======\n    return 5\n>>>>>>> REPLACE\n"
    p = parse_response(text)
    assert p.kind == "edits" and p.edits == [Edit("    return 2\n", "    return 5\n")]
    assert parse_response("I think the program is fine.").kind == "none"
    f = parse_response("Here:\n```python\nOUT_CHAR_BUDGET = 16000\nclass Memory:\n    pass\n```\n")
    assert f.kind == "file" and f.whole_file.startswith("OUT_CHAR_BUDGET")
    with pytest.raises(EditError, match="not closed"):
        parse_response("<<<<<<< SEARCH\n    return 2\n=======\n    return 5\n")


def test_noop_and_duplicate_children_are_rejected_before_evaluation():
    arch = Archive()
    parent = Candidate("seed", None, 0, "seed", None, "seed", status="evaluated", key=program_key(SEED))
    arch.add(parent)
    cosmetic = SEED.replace('"""An append-only list of rendered units."""', '"""Other words."""  # a comment')
    assert precheck(cosmetic, parent, arch).startswith("no-op")
    child = SEED.replace("OUT_CHAR_BUDGET]", "OUT_CHAR_BUDGET // 2]")
    assert precheck(child, parent, arch) == ""
    arch.add(Candidate("r01", "seed", 1, "cold", None, "x", status="evaluated", key=program_key(child)))
    assert precheck(child + "\n# again\n", parent, arch) == "duplicate of archived program r01"
    assert precheck("def broken(:\n", parent, arch).startswith("syntax error at line 1")


# ------------------------------------------------------------------ ledger


def test_ledger_counts_per_role_and_round_and_budgets_stop():
    led = Ledger(budgets={"coder": 100, "plan": None})
    led.add(1, "coder", 1, 60, 30)
    led.add(2, "coder", 1, 5, 4)
    led.add(2, "plan", 10, 500, 80)
    assert led.totals()["coder"] == {"calls": 2, "prompt": 65, "completion": 34}
    assert led.round_tokens(2) == 589 and led.used("coder") == 99
    led.check()  # 99 < 100
    led.add(3, "coder", 1, 1, 0)
    with pytest.raises(BudgetExhausted) as e:
        led.check()
    assert (e.value.role, e.value.used, e.value.budget) == ("coder", 100, 100)
    with pytest.raises(ValueError, match="unknown ledger role"):
        led.add(1, "wizard", 1)
    assert Ledger.from_json(led.to_json()).totals() == led.totals()
