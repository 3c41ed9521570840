"""LoCoMo F1 and answer-recall, checked against hand-computed values.

Stems used below (nltk PorterStemmer): paris→pari, running/runs→run, was→wa, shoes→shoe,
moved→move, daily→daili; london, rome, sweden, pottery→potteri, hiking→hike stay comparable.
"""
import pytest

from memgym.rewards.scoring.metrics import answer_recall, answer_tokens, f1_score, locomo_f1, multi_answer_f1, normalize_answer


def test_normalize_answer_strips_case_punct_articles_and():
    # lower → "the eiffel-tower, and paris!"; punct → "the eiffeltower and paris";
    # the/and removed; whitespace collapsed.
    assert normalize_answer("The Eiffel-Tower, and Paris!") == "eiffeltower paris"
    # whole words only: "andrew" and "theater" keep their letters.
    assert normalize_answer("Andrew AND the Theater") == "andrew theater"
    assert normalize_answer("  a  ") == ""


def test_answer_tokens_are_stemmed():
    assert answer_tokens("Running and runs") == ["run", "run"]
    assert answer_tokens("Paris") == ["pari"]


def test_f1_partial_overlap():
    # pred tokens [pari, london], gold [london]: overlap 1, P = 1/2, R = 1,
    # F1 = 2·(1/2)·1 / (1/2 + 1) = 2/3.
    assert f1_score("Paris and London", "London") == pytest.approx(2 / 3)
    # reversed: P = 1, R = 1/2 → 2/3 again.
    assert f1_score("London", "Paris and London") == pytest.approx(2 / 3)


def test_f1_stemming():
    # running → run, runs → run: identical token lists.
    assert f1_score("running", "runs") == 1.0
    # [she, wa, run] vs [run]: P = 1/3, R = 1, F1 = (2/3)/(4/3) = 1/2.
    assert f1_score("She was running", "runs") == pytest.approx(0.5)


def test_f1_counts_duplicates_as_multiset():
    # pred [run, run], gold [run]: Counter overlap is 1 → P = 1/2, R = 1 → 2/3.
    assert f1_score("run run", "run") == pytest.approx(2 / 3)


def test_f1_zero_cases():
    assert f1_score("", "London") == 0.0
    assert f1_score("Berlin", "London") == 0.0
    assert f1_score("the", "the") == 0.0  # both empty after normalisation


def test_category_2_and_4_plain_f1():
    assert locomo_f1("Paris and London", "London", "4") == pytest.approx(2 / 3)
    assert locomo_f1("Paris and London", "London", 2) == pytest.approx(2 / 3)
    # int gold (a LoCoMo quirk) is scored as its text.
    assert locomo_f1("2022", 2022, 2) == 1.0


def test_category_1_multi_hop_splits_both_sides():
    # gold parts: pottery → max(f1(hiking,pottery)=0, f1(pottery,pottery)=1) = 1;
    # hiking → 1; painting → 0. Mean = 2/3.
    assert locomo_f1("hiking, pottery", "pottery, hiking, painting", "1") == pytest.approx(2 / 3)
    # one prediction part [pari, london]; gold "London" → 2/3, "Rome" → 0; mean = 1/3.
    assert locomo_f1("Paris and London", "London, Rome", 1) == pytest.approx(1 / 3)
    # Same pair under category 4 is one F1: [pari, london] vs [london, rome]:
    # P = 1/2, R = 1/2 → 1/2, so the category rule matters.
    assert locomo_f1("Paris and London", "London, Rome", 4) == pytest.approx(0.5)
    assert multi_answer_f1("Rome, London", "London, Rome") == 1.0


def test_category_3_scores_text_before_semicolon():
    gold = "Sweden; she moved from there"
    assert locomo_f1("Sweden", gold, "3") == 1.0
    # Without the rule, gold has 5 tokens: P = 1, R = 1/5, F1 = (2/5)/(6/5) = 1/3.
    assert locomo_f1("Sweden", gold, "4") == pytest.approx(1 / 3)


def test_category_5_abstention_phrases():
    assert locomo_f1("No information available.", "", "5") == 1.0
    assert locomo_f1("That was NOT MENTIONED in the chat", "anything", 5) == 1.0
    assert locomo_f1("She went to Paris", "Paris", "5") == 0.0
    assert locomo_f1("no info available", "", "5") == 0.0


def test_unknown_category_and_bad_types():
    with pytest.raises(ValueError, match="unknown LoCoMo category '6'"):
        locomo_f1("x", "x", "6")
    with pytest.raises(ValueError, match="temporal"):
        locomo_f1("x", "x", "temporal")
    with pytest.raises(ValueError):
        locomo_f1("x", "x", 0)
    with pytest.raises(TypeError, match="category"):
        locomo_f1("x", "x", True)
    with pytest.raises(TypeError, match="prediction"):
        locomo_f1(None, "x", "4")
    with pytest.raises(TypeError, match="gold answer"):
        locomo_f1("x", ["x"], "4")


def test_answer_recall_fractions():
    # gold {pari, london}; context has london only → 1/2.
    assert answer_recall("Paris and London", "We visited london last May") == pytest.approx(0.5)
    # gold {run, shoe}; context {he, run, daili} → 1/2 (stemming makes runs ≈ running).
    assert answer_recall("running shoes", "He runs daily") == pytest.approx(0.5)
    # gold {three, blue, cat}; order in the context does not matter → 3/3.
    assert answer_recall("three blue cats", "blue cat, three of them") == 1.0
    # gold distinct tokens {new, york}: duplicates count once; context has york → 1/2.
    assert answer_recall("New York, New York", "york") == pytest.approx(0.5)
    # gold {ate, 3, appl} (stems of "ate 3 apples"), context holds 3 only → 1/3.
    assert answer_recall("ate 3 apples", "there were 3") == pytest.approx(1 / 3)
    assert answer_recall(2022, "moved in 2022") == 1.0


def test_answer_recall_empty_gold_and_context():
    assert answer_recall("", "anything") == 0.0
    assert answer_recall("the", "the") == 0.0
    assert answer_recall("London", "") == 0.0
    with pytest.raises(TypeError, match="context"):
        answer_recall("London", None)
