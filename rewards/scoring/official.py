"""Each benchmark's official LLM judge as a :class:`memgym.rewards.scoring.judge.Scorer`, over the
protocol files (:mod:`memgym.rewards.scoring.judge_protocols`), and the offline rubric-recall proxy.

One :meth:`score` sends one batched ``generate`` (BEAM event ordering: one per answer line)
through the response cache; nothing is retried. An unreadable reply is scored as officially,
counted in :class:`JudgeStats` and evicted from the cache. ``last`` holds a :class:`Judged`
per item of the latest call.
"""
from __future__ import annotations

import dataclasses
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from memgym.llm.base import Backend, GenerationParams, LLMError
from memgym.rewards.scoring import judge_protocols as P
from memgym.rewards.scoring.beam_judge import EVENT_ORDERING, rubric_recall
from memgym.rewards.scoring.judge import ScoreItem, check_score_items

__all__ = ["JudgeStats", "Judged", "LongMemEvalScorer", "BeamScorer", "LoCoMoJudgeScorer", "RubricRecallScorer",
           "judge_stats"]


@dataclass
class JudgeStats:
    """A judge's calls over its life: ``prompts`` sent, ``unreadable`` replies (scored as the
    official rule scores them, never cached) and up to 5 ``examples`` of those. No judge
    retries: the official protocols do not."""

    prompts: int = 0
    unreadable: int = 0
    examples: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        return {"prompts": self.prompts, "unreadable": self.unreadable, "retries": 0, "examples": list(self.examples)}


@dataclass
class Judged:
    """One judgement: ``score`` in [0, 1] (NaN for undefined BEAM tau), ``calls`` =
    ``[{"messages", "params", "reply", "readable"}]``, ``unreadable`` count, ``detail``.
    """

    score: float
    calls: list[dict] = field(default_factory=list)
    unreadable: int = 0
    detail: dict | None = None


class _ProtocolScorer(ABC):
    """Shared plumbing: batched requests, accounting, forgetting unreadable replies."""

    name = "llm"
    needs_prediction = True
    dataset: str = ""

    def __init__(self, backend: Backend, protocol: str = "official"):
        if not callable(getattr(backend, "generate", None)):
            raise TypeError(f"judge backend must implement memgym.llm.base.Backend, got {type(backend).__name__}")
        self.backend = backend
        self.protocol = P.check_protocol(self.dataset, protocol)
        P.load_judge_file(self.dataset, self.protocol)  # a changed official file is refused before any call
        self.stats = JudgeStats()
        self.last: list[Judged] = []

    @property
    def parse_failures(self) -> int:
        """Unreadable replies over the scorer's life (see the module docstring)."""
        return self.stats.unreadable

    @property
    def note(self) -> str:
        return P.protocol_note(self.dataset, self.protocol)

    def _ask(self, prompts: list[list[dict]], params: GenerationParams, read: Callable[[str], tuple[object, bool]],
             schema=None) -> list[tuple[object, dict]]:
        """``[(value, call record)]`` per prompt, from one batched call."""
        if not prompts:
            return []
        # The protocol is part of the response-cache key (a reply is never replayed under another
        # protocol; a custom one by its file's sha256); cache_tag is never sent to the model.
        params = dataclasses.replace(params,
                                     cache_tag=f"judge:{self.dataset}:{P.protocol_identity(self.dataset, self.protocol)}")
        schemas = [schema] * len(prompts) if schema is not None else None
        out = self.backend.generate(prompts, params, schemas=schemas) if schemas else self.backend.generate(prompts, params)
        if len(out) != len(prompts):
            raise LLMError(f"judge backend {getattr(self.backend, 'model_id', '?')} returned {len(out)} completions "
                           f"for {len(prompts)} prompts")
        self.stats.prompts += len(prompts)
        res, bad = [], []
        settings = {"temperature": params.temperature, "max_tokens": params.max_new_tokens,
                    **({"response_format": schema.response_format()} if schema is not None else {})}
        for msgs, c in zip(prompts, out):
            reply = c.text if isinstance(getattr(c, "text", None), str) else ""
            value, readable = read(reply)
            if not readable:
                bad.append(msgs)
                self.stats.unreadable += 1
                if len(self.stats.examples) < 5:
                    self.stats.examples.append(reply[:200])
            res.append((value, {"messages": msgs, "params": settings, "reply": reply, "readable": readable}))
        if bad:
            forget = getattr(self.backend, "forget", None)
            if callable(forget):
                forget(bad, params, [schema] * len(bad) if schema is not None else None)
        return res

    def score(self, items: list[ScoreItem]) -> list[float]:
        self.last = self.judge(check_score_items(items))
        return [j.score for j in self.last]

    @abstractmethod
    def judge(self, items: Sequence[ScoreItem]) -> list[Judged]:
        """One :class:`Judged` per item, in order (each protocol's own rule)."""


def _judged_one(pairs: list[tuple[object, dict]], value: float) -> Judged:
    return Judged(value, [c for _, c in pairs], sum(not c["readable"] for _, c in pairs))


class LongMemEvalScorer(_ProtocolScorer):
    """LongMemEval's answer check (:func:`memgym.rewards.scoring.judge_protocols.longmemeval_messages`): items need
    ``category`` (the question type) and ``qid``; 1.0 for a yes, 0.0 otherwise."""

    dataset = "longmemeval"

    def judge(self, items: Sequence[ScoreItem]) -> list[Judged]:
        prompts = [P.longmemeval_messages(str(it.category), it.question, it.gold, it.prediction, it.qid, self.protocol)
                   for it in items]

        def read(reply):
            low = reply.strip().lower()
            return P.longmemeval_label(reply), ("yes" in low or "no" in low)

        res = self._ask(prompts, P.longmemeval_params(self.protocol), read)
        return [_judged_one([r], 1.0 if r[0] else 0.0) for r in res]


class LoCoMoJudgeScorer(_ProtocolScorer):
    """MemBuilder's CORRECT/WRONG judge for LoCoMo (:func:`memgym.rewards.scoring.judge_protocols.membuilder_messages`,
    ``response_format`` JSON object)."""

    dataset = "locomo"

    def judge(self, items: Sequence[ScoreItem]) -> list[Judged]:
        prompts = [P.membuilder_messages(it.question, it.gold, it.prediction, self.protocol) for it in items]
        res = self._ask(prompts, P.membuilder_params(self.protocol), P.membuilder_label, schema=P.JSON_OBJECT)
        return [_judged_one([r], float(r[0])) for r in res]


class BeamScorer(_ProtocolScorer):
    """BEAM's judge: the mean rubric item score, or for event ordering ``tau_norm`` after greedy
    alignment (:mod:`memgym.rewards.scoring.judge_protocols`). Items need ``category`` (the ability).
    """

    dataset = "beam"

    def judge(self, items: Sequence[ScoreItem]) -> list[Judged]:
        rubric_prompts, owner = [], []
        for i, it in enumerate(items):
            if str(it.category) != EVENT_ORDERING:
                for item in it.rubric:
                    rubric_prompts.append(P.beam_rubric_messages(it.question, item, it.prediction, self.protocol))
                    owner.append(i)

        def read_score(reply):
            v = P.beam_item_score(reply, self.protocol)
            return (0.0 if v is None else v), v is not None

        res = self._ask(rubric_prompts, P.beam_rubric_params(), read_score)
        per: dict[int, list] = {i: [] for i in range(len(items))}
        for i, r in zip(owner, res):
            per[i].append(r)
        out: list[Judged | None] = [None] * len(items)
        for i, it in enumerate(items):
            if str(it.category) != EVENT_ORDERING:
                vals = [float(v) for v, _ in per[i]]
                out[i] = _judged_one(per[i], sum(vals) / len(vals) if vals else 0.0)
        orders = [i for i, it in enumerate(items) if str(it.category) == EVENT_ORDERING]
        for i, j in zip(orders, self._event_ordering([items[i] for i in orders])):
            out[i] = j
        return out  # type: ignore[return-value]

    def _event_ordering(self, items: Sequence[ScoreItem]) -> list[Judged]:
        """``align_with_llm`` for every item at once: round k asks, for line k of every answer,
        the equivalence with each still-unused reference item (one batch); line k takes the
        first reference item (in reference order) judged the same."""
        params = GenerationParams(max_new_tokens=P.DEFAULT_MAX_TOKENS["beam_equivalence"], temperature=0.0)
        systems = [P.beam_system_list(it.prediction) for it in items]
        refs = [list(it.rubric) for it in items]
        used = [set() for _ in items]
        canon: list[list[str]] = [[] for _ in items]
        calls: list[list[tuple]] = [[] for _ in items]
        for k in range(max((len(s) for s in systems), default=0)):
            prompts, where = [], []
            for i, s in enumerate(systems):
                if k < len(s):
                    for j, r in enumerate(refs[i]):
                        if j not in used[i]:
                            prompts.append(P.beam_equivalence_messages(r, s[k], self.protocol))
                            where.append((i, j))
            res = self._ask(prompts, params, lambda reply: (P.beam_equivalence_label(reply),
                                                            "yes" in reply.lower() or "no" in reply.lower()))
            match: dict[int, int] = {}
            for (i, j), r in zip(where, res):
                calls[i].append(r)
                if r[0] and i not in match:
                    match[i] = j
            for i, s in enumerate(systems):
                if k < len(s):
                    if i in match:
                        used[i].add(match[i])
                        canon[i].append(refs[i][match[i]])
                    else:
                        canon[i].append(s[k])
        out = []
        for i in range(len(items)):
            eo = P.beam_event_ordering(refs[i], canon[i])
            j = _judged_one(calls[i], eo["tau_norm"])
            j.detail = {"aligned": canon[i], **{k: eo[k] for k in ("precision", "recall", "f1")}}
            out.append(j)
        return out


class RubricRecallScorer:
    """Offline BEAM proxy (:func:`memgym.rewards.scoring.beam_judge.rubric_recall`) over the text scored:
    the retrieved context when there is one, else the prediction. No model call."""

    name = "rubric-recall"
    needs_prediction = False

    def score(self, items: list[ScoreItem]) -> list[float]:
        items = check_score_items(items)
        for i, it in enumerate(items):
            if not it.rubric:
                raise ValueError(f"items[{i}] ({it.qid or it.question[:40]!r}) has no rubric: rubric-recall "
                                 f"scores BEAM questions only")
        return [rubric_recall(it.rubric, it.context or it.prediction) for it in items]


def judge_stats(scorer) -> dict | None:
    """The judge's call accounting (``prompts``, ``unreadable``, ``retries`` (always 0),
    ``examples``) of an LLM scorer, or None for a scorer that makes no judge call."""
    st = getattr(scorer, "stats", None)
    if isinstance(st, JudgeStats):
        return st.to_dict()
    return None
