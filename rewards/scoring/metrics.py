"""Offline answer metrics: LoCoMo token F1 and answer-recall.

Source: snap-research/LoCoMo ``task_eval/evaluation.py`` (``normalize_answer``, ``f1_score``,
``f1``, ``eval_question_answering``): lowercase, no punctuation or a/an/the/and, Porter stems;
category 1 split on ","; 3 gold before ";"; 5 abstention phrases; 2/4 plain F1.
``answer_recall`` is memgym's offline proxy (docs/design.md § "Dense session reward and ADRPO").
"""
from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache

from nltk.stem import PorterStemmer

__all__ = ["LOCOMO_CATEGORIES", "ABSTENTION_PHRASES", "normalize_answer", "answer_tokens", "stem", "f1_score",
           "multi_answer_f1", "locomo_f1", "answer_recall"]

#: LoCoMo's native question categories (as strings): 1 multi-hop, 2 temporal,
#: 3 open-domain, 4 single-hop, 5 adversarial.
LOCOMO_CATEGORIES: tuple[str, ...] = ("1", "2", "3", "4", "5")

#: Phrases that make a category-5 (adversarial) prediction correct, matched
#: case-insensitively as substrings of the raw prediction (official rule).
ABSTENTION_PHRASES: tuple[str, ...] = ("no information available", "not mentioned")

_PUNCT = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the|and)\b")
_STEMMER = PorterStemmer()


@lru_cache(maxsize=65536)
def stem(word: str) -> str:
    """Porter stem of one lower-case token (NLTK's PorterStemmer, as LoCoMo's evaluation.py), cached."""
    return _STEMMER.stem(word)


def _require_text(value, what: str) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{what} must be a str, got {type(value).__name__}: {value!r:.80}")
    return value


def _gold_text(answer) -> str:
    # LoCoMo stores some answers as ints; the official code scores str(answer).
    if isinstance(answer, bool) or not isinstance(answer, (str, int)):
        raise TypeError(f"gold answer must be a str or int, got {type(answer).__name__}: {answer!r:.80}")
    return str(answer)


def normalize_answer(s: str) -> str:
    """LoCoMo ``normalize_answer``: lowercase, no punctuation, no a/an/the/and, single spaces.
    Raises TypeError for a non-str.
    """
    s = _require_text(s, "text to normalise").lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(s: str) -> list[str]:
    """Porter-stemmed tokens of ``normalize_answer(s)``, duplicates kept. Raises TypeError."""
    return [stem(w) for w in normalize_answer(s).split()]


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token F1 in [0, 1] of stemmed tokens (multiset overlap; 0 without overlap). Source: LoCoMo
    ``evaluation.f1_score``. Raises TypeError for non-str.
    """
    return _token_f1(
        answer_tokens(_require_text(prediction, "prediction")),
        answer_tokens(_require_text(ground_truth, "ground_truth")),
    )


def multi_answer_f1(prediction: str, ground_truth: str) -> float:
    """Multi-hop F1 in [0, 1]: mean over ","-parts of gold of the best part F1 (LoCoMo
    ``evaluation.f1``). Raises TypeError.
    """
    preds = [p.strip() for p in _require_text(prediction, "prediction").split(",")]
    golds = [g.strip() for g in _require_text(ground_truth, "ground_truth").split(",")]
    pred_toks = [answer_tokens(p) for p in preds]
    best = [max(_token_f1(pt, answer_tokens(g)) for pt in pred_toks) for g in golds]
    return sum(best) / len(best)


def _category_key(category) -> str:
    if isinstance(category, bool) or not isinstance(category, (str, int)):
        raise TypeError(f"LoCoMo category must be a str or int, got {type(category).__name__}: {category!r}")
    key = str(category).strip()
    if key not in LOCOMO_CATEGORIES:
        raise ValueError(f"unknown LoCoMo category {category!r}; expected one of {', '.join(LOCOMO_CATEGORIES)}")
    return key


def locomo_f1(prediction: str, answer: str | int, category: str | int) -> float:
    """The official LoCoMo score of one prediction in [0, 1] by category "1".."5" (str or int;
    int answers scored as str). Source: LoCoMo ``evaluation.eval_question_answering``. Raises
    ValueError for an unknown category, TypeError for wrong types.
    """
    key = _category_key(category)
    prediction = _require_text(prediction, "prediction")
    if key == "5":
        low = prediction.lower()
        return 1.0 if any(p in low for p in ABSTENTION_PHRASES) else 0.0
    gold = _gold_text(answer)
    if key == "1":
        return float(multi_answer_f1(prediction, gold))
    if key == "3":
        gold = gold.split(";")[0].strip()
    return f1_score(prediction, gold)


def answer_recall(answer: str | int, context: str) -> float:
    """Share in [0, 1] of the gold's distinct stemmed tokens found in the context's; 0.0 for a gold
    without tokens. Source: docs/design.md § "Dense session reward and ADRPO". Raises TypeError.
    """
    gold = set(answer_tokens(_gold_text(answer)))
    if not gold:
        return 0.0
    ctx = set(answer_tokens(_require_text(context, "context")))
    return len(gold & ctx) / len(gold)
