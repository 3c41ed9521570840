"""Static baselines as memory programs (memory_bank/programs: full_history = the seed, bm25,
dense_topk, hybrid_rrf, reference): each passes the four validation levels, and on a tiny
hand-made conversation (`turns` extraction, the question as the query, answer-recall, the hash
embedder) retrieves and scores what a hand count says; BM25's scores equal the formula worked
by hand."""
from __future__ import annotations

import math
from datetime import datetime

import pytest

from memgym.evolution.execution.runner import ProgramRunner, RunnerSettings
from memgym.evolution.execution.validate import ValidationLimits, validate_program
from memgym.llm.embeddings import HashEmbedder
from memgym.llm.runtime import Runtime
from memgym.memory_bank.programs import BASELINES, baseline_program_path, read_program_source
from memgym.memory_bank.schema import Capability, Conversation, QAItem, Session, Turn

LINES = ["[2023-05-08] Ann: I adopted a cat named Miso", "[2023-05-08] Bob: My dog likes the park",
         "[2023-05-08] Ann: Miso sleeps all day", "[2023-05-08] Bob: I bought a red bike"]


def _conversation() -> Conversation:
    turns = [("Ann", "I adopted a cat named Miso"), ("Bob", "My dog likes the park"), ("Ann", "Miso sleeps all day"),
             ("Bob", "I bought a red bike")]
    session = Session(1, "s1", datetime(2023, 5, 8, 10), "8 May 2023",
                      tuple(Turn(f"s1:{i}", a, b) for i, (a, b) in enumerate(turns)))
    qs = (QAItem("q1", "What is the name of Ann's cat?", "Miso", ("s1:0",), "4", Capability.FACTUAL),
          QAItem("q2", "What did Bob buy?", "a red bike", ("s1:3",), "4", Capability.FACTUAL))
    return Conversation("c", ("Ann", "Bob"), (session,), qs)


def _run(source: str):
    runner = ProgramRunner(Runtime(embedder=HashEmbedder(256)),
                           RunnerSettings(extractor="turns", plan_mode="question", scorer="answer-recall",
                                          diagnostics=False))
    return {t.qa.id: (t.retrieved, t.score) for t in runner.run(source, [_conversation()]).tasks}


def _source(name: str, top_k: int | None = None) -> str:
    src = read_program_source(baseline_program_path(name))
    if top_k is not None:
        for k in (10, 40):
            src = src.replace(f"TOP_K = {k}\n", f"TOP_K = {top_k}\n")
    return src


@pytest.mark.parametrize("name", list(BASELINES))
def test_each_baseline_passes_the_four_validation_levels(name):
    res = validate_program(_source(name), None, ValidationLimits())
    assert res.ok, res.reason
    assert res.stats["levels_passed"] == [1, 2, 3, 4]


def test_bm25_scores_equal_the_formula_by_hand():
    ns: dict = {}
    exec(compile(_source("bm25"), "bm25.py", "exec"), ns)  # noqa: S102 - our own shipped program
    mem = ns["Memory"](toolkit=None)
    mem.lines, mem.lengths, mem.postings = [], [], {}
    for line in LINES:  # index through the program's own code path
        unit = ns["MemoryUnit"](content=line.split("] ", 1)[1])
        mem.index([unit], {"date": "2023-05-08T10:00:00", "date_text": ""})
    assert mem.lines == LINES and mem.lengths == [10, 9, 8, 9]  # avgdl = 9
    idf1, idf2 = math.log(1 + 3.5 / 1.5), math.log(1 + 2.5 / 2.5)  # a term in 1 line / in 2 lines, N = 4
    got = mem.bm25("What is the name of Ann's cat?")  # ann (lines 0, 2), cat (0), the (1)
    norm = {0: 1.2 * (0.25 + 0.75 * 10 / 9), 1: 1.2, 2: 1.2 * (0.25 + 0.75 * 8 / 9)}
    assert got == pytest.approx({0: (idf2 + idf1) * 2.2 / (1 + norm[0]), 1: idf1 * 2.2 / (1 + norm[1]),
                                 2: idf2 * 2.2 / (1 + norm[2])})
    assert got[0] == pytest.approx(1.8146, abs=1e-4) and got[1] == pytest.approx(1.2040, abs=1e-4)
    assert mem.bm25("What did Bob buy?") == pytest.approx({1: idf2, 3: idf2})  # a tie: same length


def test_baselines_retrieve_and_score_the_hand_count():
    full = "\n".join(LINES)
    assert _run(_source("full_history")) == {"q1": (full, 1.0), "q2": (full, 1.0)}
    # BM25, shipped TOP_K = 10: every line with a positive score, best first (0: ann+cat, 1: the, 2: ann);
    # "Bob" ties lines 1 and 3, the earlier first; line 3 holds "red bike" → recall 1
    assert _run(_source("bm25")) == {"q1": ("\n".join([LINES[0], LINES[1], LINES[2]]), 1.0),
                                     "q2": (LINES[1] + "\n" + LINES[3], 1.0)}
    # TOP_K = 1: the tie goes to line 1, which lacks "red bike" (the gold's content tokens) → 0
    for name in ("bm25", "dense_topk", "hybrid_rrf", "reference"):
        assert _run(_source(name, top_k=1)) == {"q1": (LINES[0], 1.0), "q2": (LINES[1], 0.0)}, name
    dense = _run(_source("dense_topk"))
    assert dense["q1"][0].split("\n")[0] == LINES[0] and sorted(dense["q1"][0].split("\n")) == sorted(LINES)
    assert dense["q1"][1] == dense["q2"][1] == 1.0


def test_a_baseline_that_cannot_run_is_reported_not_fatal(tmp_path, monkeypatch):
    import memgym.memory_bank.programs as programs
    from memgym.evolution.search.config import EvolveConfig
    from memgym.evolution.search.api import evolve

    broken = tmp_path / "broken.py"
    broken.write_text("def (\n")
    real = programs.baseline_program_path
    monkeypatch.setattr(programs, "baseline_program_path", lambda n: broken if n == "bm25" else real(n))
    cfg = EvolveConfig(train=["conv-26"], valid=["conv-30"], n_sessions=1, max_questions=3, extractor="turns",
                       plan_mode="question", scorer="answer-recall", rounds_cold=0, rounds_refine=0, rounds_integrate=0,
                       baselines=["full_history", "bm25"], embedder="hash:64", progress=False, out=str(tmp_path / "run"))
    s = evolve(cfg).summary
    assert s["baselines"]["full_history"]["valid"] == s["seed"]["valid"]
    assert s["baselines"]["bm25"]["valid"] is None and "syntax error" in s["baselines"]["bm25"]["error"]
    line = next(x for x in (tmp_path / "run" / "report.md").read_text().splitlines() if "could not run" in x)
    assert line.startswith("- baseline bm25 could not run: valid: ") and "syntax error" in line
