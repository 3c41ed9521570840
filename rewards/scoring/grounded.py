"""The default offline scorer: ``grounded-recall``, credit only for source text a reader could use.

A word-coverage proxy (answer-recall, rubric-recall) counts gold tokens anywhere in the retrieved
text, so a query-independent list of the conversation's frequent words outscores retrieval. This
scorer credits a context only for conversation text it holds **verbatim as contiguous spans**:

* **Tokens.** LoCoMo's answer normalisation (lowercase, no punctuation, no a/an/the/and) and
  Porter stems (:func:`memgym.rewards.scoring.metrics.answer_tokens`), so case, punctuation, whitespace,
  speaker/date prefixes and cut-off turns (light compaction) change nothing.
* **Spans.** A token of a source text counts as *present* when some run of ``k`` (default 4)
  consecutive source tokens around it occurs as ``k`` consecutive tokens of the context (texts
  shorter than ``k`` tokens must occur whole). A bag of words, a deduplicated or shuffled word
  list, or a turn with its words shuffled, keeps almost no such run.
* **Evidence recall** (``ev``): the mean, over the question's gold evidence turns, of the share of
  the turn's tokens present (capped: a turn counts as wholly present once ``cap`` (default 32) of
  its tokens are, so one long message need not fill the budget). The retrieval recall of the gold
  evidence is the retrieval metric of both benchmarks' papers: LoCoMo (Maharana et al., 2024,
  arXiv 2402.17753, §6, "recall@k" of the evidence dialogs of RAG) and LongMemEval (Wu et al.,
  2024, arXiv 2410.10813, §5, Recall@k / NDCG@k of the evidence sessions/turns); memgym's part is
  the span match over a cut context instead of a ranked list.
* **Grounded answer recall** (``ans``): the share of the gold answer's distinct tokens (BEAM: of
  the rubric items, each needing all its content tokens, as :func:`rubric_recall`) found among the
  context tokens that lie inside spans of ``k`` tokens that occur in some turn of the conversation
  (memgym's rule): a word the context holds only outside real conversation text earns nothing.
* **Score** = ``(ev + max(ev, ans)) / 2``: half the credit is the gold evidence held; the other
  half is the answer's words inside real conversation text, or the evidence again when that is
  higher (a computed date, a yes/no or an inference need not occur in the evidence verbatim, and
  a context holding all the evidence holds what a reader needs).
* **Questions without gold evidence** (abstention items, evidence ids the loader dropped) are
  *undefined* (NaN): no offline rule tells a context that supports abstaining from one that does
  not. Summaries leave NaN out of every mean and count it under ``undefined``.

Everything is memgym's own offline proxy (no benchmark defines it); the official scores are the
``f1`` / ``llm`` scorers. Calibration against answered F1 and the adversarial programs:
``scripts/experiments/offline_scorer/``.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import math

from memgym.memory_bank.schema import Conversation
from memgym.rewards.scoring.beam_judge import rubric_item_tokens
from memgym.rewards.scoring.judge import ScoreItem, check_score_items
from memgym.rewards.scoring.metrics import answer_tokens
from memgym.rewards.scoring.official import Judged

__all__ = ["SPAN_TOKENS", "EVIDENCE_CAP", "SourceIndex", "GroundedParts", "grounded_parts", "source_index",
           "GroundedRecallScorer"]

#: ``k``: the shortest run of consecutive tokens that counts as text taken from the source.
SPAN_TOKENS = 4
#: Tokens of one evidence turn that make it count as wholly present.
EVIDENCE_CAP = 32


def _grams(tokens: Sequence[str], k: int) -> set[int]:
    return {hash(tuple(tokens[i:i + k])) for i in range(len(tokens) - k + 1)}


@dataclass
class SourceIndex:
    """One conversation's source text for grounding: each turn's tokens by turn id and the
    hashes of every run of ``k`` consecutive tokens inside a turn (runs never cross turns)."""

    k: int
    turns: dict[str, list[str]]
    grams: set[int] = field(repr=False)

    @classmethod
    def build(cls, conversation: Conversation, k: int = SPAN_TOKENS) -> "SourceIndex":
        turns: dict[str, list[str]] = {}
        grams: set[int] = set()
        for session in conversation.sessions:
            for turn in session.turns:
                toks = answer_tokens(turn.text + (f" {turn.image_caption}" if turn.image_caption else ""))
                turns[turn.id] = toks
                grams |= _grams(toks, k)
        return cls(k, turns, grams)


_INDEX_CACHE: dict[int, tuple[Conversation, SourceIndex]] = {}


def source_index(conversation: Conversation, k: int = SPAN_TOKENS) -> SourceIndex:
    """The :class:`SourceIndex` of ``conversation``, built once per conversation object (the
    last 16 kept)."""
    hit = _INDEX_CACHE.get(id(conversation))
    if hit is not None and hit[0] is conversation and hit[1].k == k:
        return hit[1]
    idx = SourceIndex.build(conversation, k)
    if len(_INDEX_CACHE) >= 16:
        _INDEX_CACHE.pop(next(iter(_INDEX_CACHE)))
    _INDEX_CACHE[id(conversation)] = (conversation, idx)
    return idx


def _present_share(source: list[str], ctx_grams: set[int], ctx_text: str, k: int, cap: int) -> float:
    """Share of ``source``'s tokens inside a run of ``k`` tokens found in the context, capped."""
    n = len(source)
    if n == 0:
        return 0.0
    if n < k:
        return 1.0 if f" {' '.join(source)} " in ctx_text else 0.0
    covered = [False] * n
    for i in range(n - k + 1):
        if hash(tuple(source[i:i + k])) in ctx_grams:
            for j in range(i, i + k):
                covered[j] = True
    return min(1.0, sum(covered) / min(n, cap))


@dataclass(frozen=True)
class GroundedParts:
    """One question's parts: ``evidence`` (ev in [0, 1], None without gold evidence),
    ``answer`` (grounded answer or rubric recall in [0, 1]), ``grounded`` (share of the context's
    tokens inside conversation spans) and ``score`` (NaN without gold evidence)."""

    evidence: float | None
    answer: float
    grounded: float
    score: float

    def to_dict(self) -> dict:
        return {"evidence": self.evidence, "answer": self.answer, "grounded": self.grounded}


def grounded_parts(context: str, index: SourceIndex, evidence: Sequence[str], *, gold: str = "",
                   rubric: Sequence[str] = (), cap: int = EVIDENCE_CAP) -> GroundedParts:
    """Score one cut ``context`` against the conversation ``index``: gold ``evidence`` turn ids
    (ids missing from the index count as absent), the gold answer ``gold``, or the BEAM ``rubric``
    when given (rubric items replace the answer). See the module docstring for the rules."""
    k = index.k
    ctx = answer_tokens(context)
    ctx_grams = _grams(ctx, k)
    ctx_text = f" {' '.join(ctx)} "
    grounded: set[str] = set()
    in_span = [False] * len(ctx)
    for i in range(len(ctx) - k + 1):
        if hash(tuple(ctx[i:i + k])) in index.grams:
            grounded.update(ctx[i:i + k])
            in_span[i:i + k] = [True] * k
    share = sum(in_span) / len(ctx) if ctx else 0.0
    if rubric:
        items = [s for s in (rubric_item_tokens(x) for x in rubric) if s]
        ans = sum(1 for s in items if s <= grounded) / len(items) if items else 0.0
    else:
        want = set(answer_tokens(gold))
        ans = len(want & grounded) / len(want) if want else 0.0
    ev_ids = list(dict.fromkeys(evidence))
    if not ev_ids:
        return GroundedParts(None, ans, share, math.nan)
    ev = sum(_present_share(index.turns.get(e, []), ctx_grams, ctx_text, k, cap) for e in ev_ids) / len(ev_ids)
    return GroundedParts(ev, ans, share, (ev + max(ev, ans)) / 2)


class GroundedRecallScorer:
    """The default offline scorer (``grounded-recall``, module docstring): reads each item's
    context, gold evidence ids, gold answer or rubric and its conversation's :class:`SourceIndex`
    (``ScoreItem.source``; ValueError naming the item when missing). No model call. ``last``
    holds one :class:`memgym.rewards.scoring.official.Judged` per item with the parts as ``detail``."""

    name = "grounded-recall"
    needs_prediction = False
    needs_source = True

    def __init__(self):
        self.last: list[Judged] = []

    def score(self, items: list[ScoreItem]) -> list[float]:
        items = check_score_items(items)
        for i, it in enumerate(items):
            if not isinstance(it.source, SourceIndex):
                raise ValueError(f"items[{i}] ({it.qid or repr(it.question[:40])}): grounded-recall needs the "
                                 f"conversation's source text (ScoreItem.source), got {type(it.source).__name__}")
        parts = [grounded_parts(it.context, it.source, it.evidence, gold=it.gold, rubric=it.rubric) for it in items]
        self.last = [Judged(p.score, detail=p.to_dict()) for p in parts]
        return [p.score for p in parts]
