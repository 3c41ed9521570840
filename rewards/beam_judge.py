"""BEAM's official judge (rubric items scored 1 / 0.5 / 0, event ordering by Kendall tau-b),
its aggregation, and the offline rubric-recall proxy.

Source: ``../shared/data/beam/README.md`` § "The official scoring" (``src/evaluation/`` of
mohammadtavakoli78/BEAM; the official judge is gpt-4.1-mini at temperature 0). The prompts are
memgym's own wording with the same rules, and two bugs of the official code are NOT copied:
the question IS shown to the judge (the official placeholder is never filled), and scores are
parsed as floats (the official ``int()`` turns partial credit 0.5 into 0).

- Every ability but event ordering: one judge call per rubric item; the judge returns
  ``{"score": 1.0 | 0.5 | 0.0, "reason": ...}``; a question's score is the mean over its items.
- Event ordering: the response is split into non-empty lines; each line is matched to the
  first still-unused rubric item (the reference order) that describes the same event, by
  yes/no judge calls (all line x item pairs go out as one batch; the greedy assignment is then
  the same as asking in sequence). Items get reference ranks 0..n-1; the response ranks the
  matched items by line order and puts every unmatched item last (tied). The score is the
  Kendall tau-b of the two rank lists (``scipy.stats.kendalltau``), normalised
  ``(tau_b + 1) / 2``; an undefined tau (fewer than two items, or nothing matched) scores 0.
- Aggregation: per chat the mean per ability, then per ability the mean over chats; the
  overall number (memgym's, the official code reports none) is the mean of the 10 abilities.
"""
from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass

import json_repair

from llm.base import Backend, GenerationParams
from rewards.answer import strip_thinking
from rewards.judge_calls import JudgeStats, judge_batch
from rewards.longmemeval_judge import parse_yes_no
from rewards.metrics import answer_tokens

__all__ = ["BEAM_ABILITY_ORDER", "EVENT_ORDERING", "rubric_prompt", "parse_rubric_score", "match_prompt",
           "kendall_tau_b_normalised", "order_score", "BeamItem", "BeamJudge", "rubric_item_tokens", "rubric_recall",
           "beam_headline",
           "OVERALL_NOTE"]

BEAM_ABILITY_ORDER: tuple[str, ...] = (
    "abstention", "contradiction_resolution", "event_ordering", "information_extraction", "instruction_following",
    "knowledge_update", "multi_session_reasoning", "preference_following", "summarization", "temporal_reasoning")
EVENT_ORDERING = "event_ordering"
OVERALL_NOTE = ("overall = mean of the 10 BEAM abilities, or of those scored when fewer are present (memgym's "
                "summary; the official BEAM code reports per-ability scores only)")

_RUBRIC_SYSTEM = (
    "You grade one criterion of an AI assistant's response to a user's question about their long chat history. "
    "You get the question, one rubric criterion and the response. Score the criterion:\n"
    "- 1.0: the response fully meets the criterion;\n"
    "- 0.5: the response meets it partly (e.g. the right fact with a detail missing or imprecise);\n"
    "- 0.0: the response does not meet it, or does not address the question at all.\n"
    "Accept paraphrases and other forms of the same number or date (\"March 3\" = \"3/3\" = \"the 3rd of "
    "March\"). A criterion that says what the response should NOT do is met when the response does not do it.\n"
    'Reply with one JSON object and nothing else: {"score": <1.0, 0.5 or 0.0>, "reason": "<one sentence>"}')
_MATCH_SYSTEM = (
    "You compare two short descriptions of events from a chat history. Say yes if the line of the response "
    "describes the same event as the reference item (wording may differ), otherwise no. Reply with one word: "
    "yes or no.")
RUBRIC_RETRY_NOTE = 'Your reply could not be read. Reply with only {"score": 1.0, 0.5 or 0.0, "reason": "..."}.'
MATCH_RETRY_NOTE = "Your reply could not be read. Reply with exactly one word: yes or no."


def rubric_prompt(question: str, item: str, response: str) -> list[dict]:
    """Judge messages for one rubric item; the question is always in the prompt."""
    user = f"Question: {question}\n\nRubric criterion: {item}\n\nResponse:\n{response}\n\nScore the criterion."
    return [{"role": "system", "content": _RUBRIC_SYSTEM}, {"role": "user", "content": user}]


def match_prompt(question: str, line: str, item: str) -> list[dict]:
    """Judge messages asking whether one response line and one reference item are the same event."""
    user = f"Question: {question}\n\nResponse line: {line}\n\nReference item: {item}\n\nSame event?"
    return [{"role": "system", "content": _MATCH_SYSTEM}, {"role": "user", "content": user}]


def parse_rubric_score(raw: str) -> float | None:
    """The ``score`` of a judge reply as a float in [0, 1], or None when unparsable.

    Thinking blocks are dropped; the text is parsed with ``json_repair`` (code fences, prose
    around the object); the first object with a ``score`` key decides; a string score
    (``"0.5"``) parses; values outside [0, 1] or non-numeric ones give None.
    """
    if not isinstance(raw, str):
        return None
    text = strip_thinking(raw).strip()
    if not text:
        return None
    try:
        parsed = json_repair.loads(text)
    except Exception:  # best-effort parser: any failure = unparsable
        return None
    for obj in parsed if isinstance(parsed, list) else [parsed]:
        if not isinstance(obj, dict):
            continue
        for k, v in obj.items():
            if isinstance(k, str) and k.strip().lower() == "score":
                if isinstance(v, bool):
                    return None
                try:
                    x = float(str(v).strip()) if isinstance(v, str) else float(v)
                except (TypeError, ValueError):
                    return None
                return x if 0.0 <= x <= 1.0 and not math.isnan(x) else None
    return None


def kendall_tau_b_normalised(reference_ranks: Sequence[float], response_ranks: Sequence[float]) -> float:
    """``(tau_b + 1) / 2`` of two rank lists (scipy's Kendall tau-b, ties handled), in [0, 1];
    0.0 when tau is undefined (fewer than two items or a constant list).

    Examples: identical orders -> 1.0; reversed -> 0.0; ``[0,1,2]`` vs ``[1,0,2]`` -> 2/3.
    """
    from scipy.stats import kendalltau

    if len(reference_ranks) != len(response_ranks):
        raise ValueError(f"rank lists differ in length: {len(reference_ranks)} vs {len(response_ranks)}")
    if len(reference_ranks) < 2:
        return 0.0
    tau = kendalltau(reference_ranks, response_ranks, variant="b").statistic
    return 0.0 if tau is None or math.isnan(tau) else (float(tau) + 1.0) / 2.0


def order_score(n_items: int, matches: Sequence[int | None]) -> float:
    """Normalised tau of a response given ``matches[i]`` = the rubric item matched by line i
    (None = no match), items ranked 0..n-1 in the reference and, in the response, by line order
    with unmatched items tied last."""
    rank = {}
    for m in matches:
        if m is not None and m not in rank:
            rank[m] = len(rank)
    resp = [rank.get(j, len(rank)) for j in range(n_items)]
    return kendall_tau_b_normalised(list(range(n_items)), resp)


def _lines(response: str) -> list[str]:
    return [x.strip() for x in strip_thinking(response).splitlines() if x.strip()]


@dataclass(frozen=True)
class BeamItem:
    """One BEAM question to score: its ability (``category``), question, rubric and the
    response text."""

    category: str
    question: str
    rubric: tuple[str, ...]
    response: str


class BeamJudge:
    """The official BEAM judge behind any backend. :meth:`score` sends every rubric-item
    prompt of every question as one batch (plus one retry batch), and every event-ordering
    line x item match prompt as one more batch. ``stats`` (rubric calls) and
    ``match_stats`` (event-ordering matches) accumulate :class:`JudgeStats`."""

    def __init__(self, backend: Backend, params: GenerationParams | None = None):
        self.backend = backend
        self.params = params or GenerationParams(max_new_tokens=128, temperature=0)
        self.match_params = GenerationParams(max_new_tokens=8, temperature=0)
        self.stats = JudgeStats()
        self.match_stats = JudgeStats()

    def score(self, items: Sequence[BeamItem]) -> list[float]:
        """One score in [0, 1] per item: the mean rubric score (0.0 for an empty rubric), or the
        normalised Kendall tau for event ordering."""
        prompts, owner = [], []
        pairs, pair_owner = [], []
        for i, it in enumerate(items):
            if it.category == EVENT_ORDERING:
                for li, line in enumerate(_lines(it.response)):
                    for j, item in enumerate(it.rubric):
                        pairs.append(match_prompt(it.question, line, item))
                        pair_owner.append((i, li, j))
            else:
                for item in it.rubric:
                    prompts.append(rubric_prompt(it.question, item, it.response))
                    owner.append(i)
        scores = judge_batch(self.backend, prompts, parse_rubric_score, self.params, RUBRIC_RETRY_NOTE, self.stats)
        same = judge_batch(self.backend, pairs, parse_yes_no, self.match_params, MATCH_RETRY_NOTE, self.match_stats)
        per_item: dict[int, list[float]] = defaultdict(list)
        for i, s in zip(owner, scores):
            per_item[i].append(0.0 if s is None else s)
        yes: dict[int, dict[tuple[int, int], bool]] = defaultdict(dict)
        for (i, li, j), v in zip(pair_owner, same):
            yes[i][(li, j)] = bool(v)
        out = []
        for i, it in enumerate(items):
            if it.category == EVENT_ORDERING:
                used: set[int] = set()
                matches: list[int | None] = []
                for li in range(len(_lines(it.response))):
                    j = next((j for j in range(len(it.rubric)) if j not in used and yes[i].get((li, j))), None)
                    if j is not None:
                        used.add(j)
                    matches.append(j)
                out.append(order_score(len(it.rubric), matches))
            else:
                v = per_item.get(i, [])
                out.append(sum(v) / len(v) if v else 0.0)
        return out


_BOILERPLATE = re.compile(r"^\s*(?:the\s+)?(?:llm\s+)?response\s+should\s+(?:\w+\s*){0,3}?:\s*", re.IGNORECASE)
#: Function words ignored by :func:`rubric_recall` (after LoCoMo normalisation and stemming).
_STOP = frozenset(answer_tokens(
    "i me my we our you your he she it its they them their this that these those is are was were be been being "
    "have has had do does did of in on at to for from by with about as or not no but if then so than into over "
    "under after before between during up down out any all each some such can could should would will shall may "
    "might must what which who whom when where why how there here very just also only own same other more most"))


def rubric_item_tokens(item: str) -> set[str]:
    """Content tokens of a rubric item: the ``LLM response should state/mention/contain:``
    prefix dropped, LoCoMo-normalised, Porter-stemmed, function words removed."""
    return {t for t in answer_tokens(_BOILERPLATE.sub("", item)) if t not in _STOP}


def rubric_recall(rubric: Sequence[str], text: str) -> float:
    """Offline BEAM proxy in [0, 1]: the share of rubric items all of whose content tokens
    (:func:`rubric_item_tokens`) occur in ``text``'s tokens. Items without content tokens are
    skipped; 0.0 when no item has any."""
    items = [s for s in (rubric_item_tokens(x) for x in rubric) if s]
    if not items:
        return 0.0
    have = set(answer_tokens(text))
    return sum(1 for s in items if s <= have) / len(items)


def beam_headline(rows: Sequence[dict]) -> dict:
    """BEAM's numbers from ``rows`` of ``{"conversation", "category", "score"}``.

    Returns ``{"by_ability": {ability: mean over chats of the chat's mean}, "by_chat":
    {chat: {ability: mean}}, "overall": mean of the abilities present, "abilities": count,
    "note": OVERALL_NOTE}``; abilities in BEAM's order.
    """
    per: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        per[str(r["conversation"])][str(r["category"])].append(float(r["score"]))
    by_chat = {c: {a: sum(v) / len(v) for a, v in abil.items()} for c, abil in per.items()}
    over: dict[str, list[float]] = defaultdict(list)
    for abil in by_chat.values():
        for a, v in abil.items():
            over[a].append(v)
    order = [a for a in BEAM_ABILITY_ORDER if a in over] + sorted(a for a in over if a not in BEAM_ABILITY_ORDER)
    by_ability = {a: sum(over[a]) / len(over[a]) for a in order}
    return {"by_ability": by_ability, "by_chat": by_chat,
            "overall": sum(by_ability.values()) / len(by_ability) if by_ability else 0.0,
            "abilities": len(by_ability), "note": OVERALL_NOTE}
