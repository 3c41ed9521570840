"""grounded-recall, the default offline scorer: hand-computed parts, and adversarial programs
that must score below BM25 on the shipped data while the gold evidence scores near 1."""
from __future__ import annotations

import json
import math
import random
import re
from collections import Counter
from dataclasses import replace
from pathlib import Path

import pytest

from memgym.memory_bank.schema import Conversation, QAItem, Session, Turn
from memgym.rewards.scoring.grounded import GroundedRecallScorer, SourceIndex, grounded_parts, source_index
from memgym.rewards.scoring.judge import ScoreItem

REPO = Path(__file__).resolve().parents[3]


def _conv() -> Conversation:
    turns = (Turn("D1:1", "Ann", "I adopted a puppy named Biscuit last Sunday at the shelter."),
             Turn("D1:2", "Bob", "Wow, that is great news, congratulations!"),
             Turn("D1:3", "Ann", "Thanks. She loves chasing tennis balls in the park."))
    q = QAItem("q1", "What is the name of Ann's puppy?", "Biscuit", evidence=("D1:1",), category="4")
    return Conversation("c1", ("Ann", "Bob"), (Session(1, "s1", None, "", turns),), (q,))


def test_parts_by_hand():
    idx = SourceIndex.build(_conv())
    # D1:1 normalised + stemmed: i adopt puppi name biscuit last sunday at shelter (9 tokens; "a"/"the" dropped)
    assert idx.turns["D1:1"] == ["i", "adopt", "puppi", "name", "biscuit", "last", "sunday", "at", "shelter"]
    full = grounded_parts("[2023-05-07] Ann: I adopted a puppy named Biscuit last Sunday at the shelter.", idx, ["D1:1"],
                          gold="Biscuit")
    assert (full.evidence, full.answer, full.score) == (1.0, 1.0, 1.0)
    # the first 5 words of the turn: runs of 4 cover tokens 1-5 of 9; "biscuit" lies inside a grounded run
    part = grounded_parts("Ann: I adopted a puppy named Biscuit", idx, ["D1:1"], gold="Biscuit")
    assert part.evidence == pytest.approx(5 / 9) and part.answer == 1.0
    assert part.score == pytest.approx((5 / 9 + 1.0) / 2)
    # the same words, shuffled: no run of 4 survives, and "biscuit" outside real text earns nothing
    shuffled = grounded_parts("Biscuit puppy Sunday adopted shelter named last I at", idx, ["D1:1"], gold="Biscuit")
    assert (shuffled.evidence, shuffled.answer, shuffled.score, shuffled.grounded) == (0.0, 0.0, 0.0, 0.0)
    # the answer inside another real turn's words, evidence absent: half credit for the answer only
    other = grounded_parts("she loves chasing tennis balls. Biscuit", idx, ["D1:1"], gold="tennis balls")
    assert (other.evidence, other.answer, other.score) == (0.0, 1.0, 0.5)
    # no gold evidence: undefined
    assert math.isnan(grounded_parts("anything at all here", idx, [], gold="Biscuit").score)
    # an evidence id the conversation lacks counts as absent
    assert grounded_parts("Ann: I adopted a puppy named Biscuit last Sunday", idx, ["D1:1", "D9:9"]).evidence == \
        pytest.approx((7 / 9) / 2)


def test_evidence_cap_and_short_turns():
    long = Turn("D1:1", "Ann", " ".join(f"w{i}" for i in range(100)))
    short = Turn("D1:2", "Bob", "Yes, Paris.")
    conv = Conversation("c", ("Ann", "Bob"), (Session(1, "s", None, "", (long, short)),))
    idx = SourceIndex.build(conv)
    # 32 of 100 tokens present make the turn count whole (cap); 16 make it half
    assert grounded_parts(" ".join(f"w{i}" for i in range(32)), idx, ["D1:1"]).evidence == 1.0
    assert grounded_parts(" ".join(f"w{i}" for i in range(16)), idx, ["D1:1"]).evidence == 0.5
    # a turn shorter than a run must occur whole, at token boundaries
    assert grounded_parts("Bob said: yes, Paris!", idx, ["D1:2"]).evidence == 1.0
    assert grounded_parts("yes parisian", idx, ["D1:2"]).evidence == 0.0


def test_scorer_needs_the_source_and_reports_parts():
    conv = _conv()
    sc = GroundedRecallScorer()
    with pytest.raises(ValueError, match=r"items\[0\] \(q1\): grounded-recall needs the conversation's source"):
        sc.score([ScoreItem("q?", "Biscuit", context="x", qid="q1", evidence=("D1:1",))])
    it = ScoreItem("q?", "Biscuit", context="Ann: I adopted a puppy named Biscuit last Sunday at the shelter",
                   qid="q1", evidence=("D1:1",), source=source_index(conv))
    assert sc.score([it]) == [1.0]
    assert sc.last[0].detail == {"evidence": 1.0, "answer": 1.0, "grounded": 0.9}  # "ann" (the speaker) is not turn text
    assert source_index(conv) is source_index(conv)  # built once per conversation


# ------------------------------------------------------------------ adversarial programs on the shipped data

def _run_program(program: str, dataset: str, ids: list[str], budget: int, questions=None):
    from memgym.data_synth.datasets import load_conversations
    from memgym.evolution.execution.runner import ProgramRunner
    from memgym.evolution.execution.settings import RunnerSettings
    from memgym.evolution.execution.stage_cache import StageCache
    from memgym.llm.runtime import Runtime

    convs = load_conversations(dataset, ids=ids)
    if questions is not None:
        convs = [replace(c, questions=tuple(q for q in c.questions if q.id in questions)) for c in convs]
    settings = RunnerSettings(extractor="turns", plan_mode="question", scorer="grounded-recall", context_tokens=budget,
                              diagnostics=False, progress=False, dataset=dataset)
    run = ProgramRunner(Runtime(), settings, StageCache(None)).run((REPO / program).read_text(), convs)
    return convs, run.tasks


def _words(text: str) -> list[str]:
    return re.findall(r"[A-Za-z0-9']+", text.lower())


def _attacks(convs, tasks, cut, rng) -> dict[str, list[str]]:
    """The context each attack program returns for each task, cut to the budget."""
    by_id = {c.id: c for c in convs}
    lists = {}
    for c in convs:
        freq = [w for w, _ in Counter(w for s in c.sessions for t in s.turns for w in _words(t.text)).most_common()]
        shuffled = freq[:]
        rng.shuffle(shuffled)
        lists[c.id] = {"frequent words": cut(" ".join(freq)), "alphabetical words": cut(" ".join(sorted(freq))),
                       "random words": cut(" ".join(shuffled))}
    answers = cut(" ; ".join(str(t.qa.answer) for t in tasks))
    out: dict[str, list[str]] = {}
    for t in tasks:
        words = _words(t.retrieved)
        dedup = list(dict.fromkeys(words))
        mixed = words[:]
        rng.shuffle(mixed)
        index = by_id[t.conversation].turn_index
        evidence = [index[e][1] for e in t.qa.evidence if e in index]
        verbatim = "\n".join(f"{x.speaker}: {x.text}" + (f" [image: {x.image_caption}]" if x.image_caption else "")
                             for x in evidence)
        ev_words = verbatim.split()
        rng.shuffle(ev_words)
        row = {**lists[t.conversation], "BM25's words deduplicated": cut(" ".join(dedup)),
               "BM25's words + abstention phrase": cut("not mentioned in the conversation " + " ".join(dedup)),
               "BM25's words shuffled": cut(" ".join(mixed)), "all gold answers": answers,
               "evidence turns, words shuffled": cut(" ".join(ev_words)), "gold evidence verbatim": cut(verbatim)}
        for k, v in row.items():
            out.setdefault(k, []).append(v)
    return out


def _mean_score(convs, tasks, contexts) -> float:
    by_id = {c.id: c for c in convs}
    sc = GroundedRecallScorer()
    vals = sc.score([ScoreItem(t.qa.question, t.qa.answer, context=ctx, qid=t.qa.id, rubric=t.qa.rubric,
                               evidence=t.qa.evidence, source=source_index(by_id[t.conversation])) for t, ctx in
                     zip(tasks, contexts)])
    vals = [v for v in vals if not math.isnan(v)]
    return sum(vals) / len(vals)


@pytest.mark.slow
@pytest.mark.parametrize("dataset,ids,budget", [
    ("locomo", ["conv-41", "conv-42"], 1024),
    ("locomo", ["conv-43", "conv-44", "conv-47", "conv-48", "conv-49", "conv-50"], 1024),
    ("beam", [f"100K-{i}" for i in range(11, 17)], 2048)], ids=["locomo-valid", "locomo-test", "beam-valid"])
def test_attacks_score_below_bm25(dataset, ids, budget):
    from memgym.rewards.scoring.context_budget import ContextBudget

    convs, tasks = _run_program("memory_bank/programs/bm25.py", dataset, ids, budget)
    bm25 = _mean_score(convs, tasks, [t.retrieved for t in tasks])
    scored = [t.score for t in tasks if not math.isnan(t.score)]
    assert bm25 == pytest.approx(sum(scored) / len(scored))  # the runner scores as the scorer does
    attacks = _attacks(convs, tasks, ContextBudget(budget).cut, random.Random(0))
    scores = {name: _mean_score(convs, tasks, ctxs) for name, ctxs in attacks.items()}
    verbatim = scores.pop("gold evidence verbatim")
    assert verbatim >= 0.95, verbatim
    assert all(v < bm25 for v in scores.values()), (bm25, scores)
    # the query-independent lists and shuffled text hold no run of conversation text at all
    for name in ("frequent words", "alphabetical words", "random words", "BM25's words shuffled",
                 "evidence turns, words shuffled"):
        assert scores[name] < 0.01, (name, scores[name])


@pytest.mark.slow
def test_agrees_with_answered_f1():
    """The four programs of $MEMGYM_DATA/answered, scored offline on the 140 questions a strong LLM
    answered from the same cut text: same ranking, and question-level Pearson r > 0.41."""
    from scipy.stats import pearsonr

    from memgym.data_synth.paths import data_root

    rows = [json.loads(x) for x in (data_root() / "answered" / "locomo_answered.jsonl").read_text().splitlines()]
    f1 = {(r["program"], r["id"]): r["f1"] for r in rows}
    programs = {"seed": "memory_bank/programs/seed.py", "bm25": "memory_bank/programs/bm25.py",
                "hybrid_rrf": "memory_bank/programs/hybrid_rrf.py",
                "demo_evolve_frozen": str(data_root() / "answered" / "demo_evolve_frozen.py")}
    xs, ys, means = [], [], {}
    for name, path in programs.items():
        ids = {r["id"] for r in rows if r["program"] == name}
        _, tasks = _run_program(path, "locomo", ["conv-43", "conv-44", "conv-47"], 1024, questions=ids)
        assert len(tasks) == 140
        means[name] = sum(t.score for t in tasks) / len(tasks)
        xs += [t.score for t in tasks]
        ys += [f1[(name, t.qa.id)] for t in tasks]
    assert means["seed"] < means["bm25"] < means["hybrid_rrf"] < means["demo_evolve_frozen"], means
    assert pearsonr(xs, ys)[0] > 0.41
