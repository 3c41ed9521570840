"""Offline answer metrics: LoCoMo token F1 and answer-recall.

Source: the LoCoMo official evaluation, snap-research/LoCoMo ``task_eval/evaluation.py``
(functions ``normalize_answer``, ``f1_score``, ``f1`` and ``eval_question_answering``), and
``../shared/data/README.md`` § "LoCoMo schema". The rules reproduced here:

- Normalisation: lowercase, strip ASCII punctuation (``string.punctuation``), remove the
  whole words a / an / the / and, collapse whitespace. Each whitespace token is then
  Porter-stemmed (nltk ``PorterStemmer``, default ``NLTK_EXTENSIONS`` mode, as upstream).
- Token F1: multiset (``Counter``) overlap of stemmed tokens; 0 when nothing overlaps.
- Category 1 (multi-hop): both prediction and gold are split on ","; for each gold part the
  best F1 over the prediction parts is taken, and those maxima are averaged over gold parts.
- Category 3 (open-domain): only the gold text before the first ";" is scored.
- Category 5 (adversarial): 1.0 if the raw prediction contains "no information available"
  or "not mentioned" (case-insensitive), else 0.0. The gold answer is not used.
- Categories 2 (temporal) and 4 (single-hop): plain token F1.

``answer_recall`` is memgym's offline reward proxy (DESIGN.md § "Dense session reward":
"the share of the gold answer's normalized tokens present in the retrieved context").
All lengths in this module are in characters or in normalised word tokens, as stated.
"""
from __future__ import annotations

import re
import string
from collections import Counter
from functools import lru_cache

from nltk.stem import PorterStemmer

__all__ = [
    "LOCOMO_CATEGORIES",
    "ABSTENTION_PHRASES",
    "normalize_answer",
    "answer_tokens",
    "stem",
    "f1_score",
    "multi_answer_f1",
    "locomo_f1",
    "answer_recall",
]

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
    """Normalise text the LoCoMo way: lowercase, drop punctuation, drop the words
    a/an/the/and, collapse whitespace to single spaces.

    Example: ``"The Eiffel-Tower, and Paris!"`` → ``"eiffeltower paris"``.
    Raises TypeError if ``s`` is not a str. Source: LoCoMo ``evaluation.normalize_answer``.
    """
    s = _require_text(s, "text to normalise").lower()
    s = "".join(ch for ch in s if ch not in _PUNCT)
    s = _ARTICLES.sub(" ", s)
    return " ".join(s.split())


def answer_tokens(s: str) -> list[str]:
    """Porter-stemmed tokens of ``normalize_answer(s)``, in order, duplicates kept.

    Example: ``"Running and runs"`` → ``["run", "run"]``. Raises TypeError on a non-str.
    """
    return [stem(w) for w in normalize_answer(s).split()]


def _token_f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    num_same = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def f1_score(prediction: str, ground_truth: str) -> float:
    """Token-level F1 in [0, 1] between stemmed normalised tokens of the two texts.

    precision = overlap / |pred tokens|, recall = overlap / |gold tokens|, where overlap is
    the multiset intersection size; F1 = 2PR / (P + R), and 0.0 if the overlap is empty
    (including an empty prediction or gold). Source: LoCoMo ``evaluation.f1_score``.
    Raises TypeError if either argument is not a str.
    """
    return _token_f1(
        answer_tokens(_require_text(prediction, "prediction")),
        answer_tokens(_require_text(ground_truth, "ground_truth")),
    )


def multi_answer_f1(prediction: str, ground_truth: str) -> float:
    """Multi-hop F1 in [0, 1] (LoCoMo ``evaluation.f1``).

    Splits both texts on ","; each part is stripped. Returns the mean over gold parts of
    ``max(f1_score(p, g) for p in prediction parts)``. Raises TypeError on non-str input.
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
    """The official LoCoMo QA score of one prediction, in [0, 1].

    category (str or int, "1".."5"):
      - 1 multi-hop: :func:`multi_answer_f1` (split both on ",", per-gold-part max, mean);
      - 2 temporal, 4 single-hop: :func:`f1_score`;
      - 3 open-domain: :func:`f1_score` against ``answer.split(";")[0].strip()``;
      - 5 adversarial: 1.0 if the prediction contains "no information available" or
        "not mentioned" (case-insensitive), else 0.0; ``answer`` is ignored.
    ``answer`` may be an int (LoCoMo stores some that way); it is scored as ``str(answer)``.
    Raises ValueError for an unknown category, TypeError for wrongly typed arguments.
    Source: LoCoMo ``evaluation.eval_question_answering``.
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
    """Share in [0, 1] of the gold answer's distinct stemmed normalised tokens that occur
    among the context's stemmed normalised tokens (set membership, order ignored).

    ``|set(tokens(answer)) ∩ set(tokens(context))| / |set(tokens(answer))|``. A gold answer
    with no tokens after normalisation (e.g. "" or "the") gives 0.0: nothing can be
    recalled, so it never rewards. ``answer`` may be an int (scored as ``str``). Raises
    TypeError on wrongly typed arguments. Source: DESIGN.md § "Dense session reward".
    """
    gold = set(answer_tokens(_gold_text(answer)))
    if not gold:
        return 0.0
    ctx = set(answer_tokens(_require_text(context, "context")))
    return len(gold & ctx) / len(gold)


def mean_or_zero(xs) -> float:
    """The arithmetic mean of the numbers ``xs``; 0.0 for none (an empty group scores 0)."""
    xs = list(xs)
    return sum(xs) / len(xs) if xs else 0.0
