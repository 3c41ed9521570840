""":class:`RunState`: the stages after extraction for one conversation (index in the sandbox,
then plan → retrieve → answer → score), each through the stage cache.
"""
from __future__ import annotations

import dataclasses
import warnings

from tqdm.auto import tqdm

from memgym.evolution.execution.extract_stage import ExtractStage
from memgym.evolution.execution.results import ConversationTrace, ProgramRunError
from memgym.evolution.execution.sandbox import ProgramRaised, SandboxedProgram, SandboxError
from memgym.evolution.execution.stage_cache import stable_hash
from memgym.llm.base import GenerationParams, TruncatedOutputError, require_complete
from memgym.llm.structured import bounded
from memgym.memory_bank.contract import (OUT_CHAR_BUDGET, FieldSpec, ProgramInfo, SessionInfo, StructuredOutputError,
                                        parse_structured, schema_hint, text_query)
from memgym.memory_bank.record_schemas import query_schema
from memgym.memory_bank.schema import Conversation, QAItem
from memgym.rewards.scoring.measure import answer_items, score_items
from memgym.rewards.scoring.metrics import answer_recall
from memgym.rewards.scoring.summary import QuestionResult


def planning_messages(instruction: str, question: str, question_date: str | None,
                      query_fields: tuple[FieldSpec, ...]) -> list[dict]:
    """Planning prompt: system = ``PLANNING_INSTRUCTION``; user = the question (and its date
    when known) and the Query schema. The answer is parsed as ONE Query object."""
    date = f"Question date: {question_date}\n" if question_date else ""
    user = (f"{date}Question: {question}\n\nAnswer with one JSON object with the fields "
            f"{schema_hint(query_fields)}.")
    return [{"role": "system", "content": instruction}, {"role": "user", "content": user}]


class RunState(ExtractStage):
    """One evaluation's state (:class:`~memgym.evolution.execution.stage_context.StageContext`) with
    the stage methods that fill it: :meth:`run_conversation` and its index, plan, retrieve,
    answer and score stages (extract: :class:`ExtractStage`)."""

    def run_conversation(self, conv: Conversation, info: ProgramInfo, sandbox: SandboxedProgram):
        """One conversation in ``sandbox`` (a fresh one): (task results, trace)."""
        trace, extract_keys = self._extract(conv, info)
        index_key = stable_hash("index", self.stage_hash["index"], self.runner.stage_settings("index"),
                                self.rt.embedder.model_id, extract_keys)
        blob = self.cache.get("index", index_key) if self.cache.wants("index") else None
        if blob is None:
            self._index(conv, trace, sandbox)
            if self.cache.wants("index"):
                self._keep_snapshot(conv, index_key, sandbox)
            live = sandbox
        else:
            self._count("index", reused=len(trace.units))
            live = None  # restored into the given (fresh) sandbox only if a retrieve must run

        def memory() -> SandboxedProgram:
            nonlocal live
            if live is None:
                try:
                    sandbox.restore(blob)
                except SandboxError as e:
                    raise ProgramRunError(f"cannot restore the built memory: {e.kind}: {e.reason}", stage="index",
                                          conversation=conv.id) from None
                live = sandbox
            return live

        questions = list(conv.questions)
        plans = self._plan(questions, info)
        results = self._retrieve(conv.id, index_key, [p["query"] for p in plans], info, memory, "questions")
        if self.runner.diagnostics:
            index = conv.turn_index
            turns = list(dict.fromkeys(e for q in questions for e in q.evidence if e in index))
            probe_queries = [text_query(info.query_fields, index[t][1].text or index[t][1].image_caption or "")
                             for t in turns]
            probes = self._retrieve(conv.id, index_key, probe_queries, info, memory, "evidence")
            trace.probes = {t: r["text"] for t, r in zip(turns, probes)}
        budget = self.runner.context_budget
        texts = [budget.cut(r["text"]) if budget else r["text"] for r in results]
        preds = self._answer(questions, info, texts)
        scores = self._score(questions, texts, preds, conv)
        tasks = [QuestionResult(conv.id, q, q.capability.value if q.capability else None, pr, s["score"],
                                recall=answer_recall(q.answer, t), judge=s["judge"], detail=s["detail"],
                                query=p["query"], plan_ok=p["ok"], retrieved=t, error=r["error"])
                 for q, p, r, t, pr, s in zip(questions, plans, results, texts, preds, scores)]
        return tasks, trace

    def _keep_snapshot(self, conv: Conversation, index_key: str, sandbox: SandboxedProgram) -> None:
        """Cache the built memory; a snapshot the sandbox cannot take (larger than its message cap,
        unpicklable) only costs a cache miss: the live memory goes on. ProgramRunError when the
        child died taking it."""
        try:
            self.cache.put("index", index_key, sandbox.snapshot())
        except SandboxError as e:
            if not sandbox.alive:
                raise ProgramRunError(f"{e.kind}: {e.reason}", stage="index", conversation=conv.id) from None
            what = (f"is larger than the sandbox's {sandbox.limits.max_message_bytes:,}-byte message cap"
                    if e.kind == "oversized" else f"failed ({e.kind})")
            warnings.warn(f"the index snapshot of conversation {conv.id} {what}: not cached, rebuilt when needed",
                          stacklevel=2)

    # ------------------------------------------------------------------ stages

    def _index(self, conv: Conversation, trace: ConversationTrace, sandbox: SandboxedProgram) -> None:
        try:
            sandbox.construct()
            for x, units in tqdm(list(zip(conv.sessions, trace.units)), desc=f"index {conv.id}", leave=False,
                                 disable=not self.settings.progress, unit="session"):
                value = sandbox.index(units, SessionInfo.from_session(x).to_dict())
                if value is not None:
                    raise ProgramRunError(f"Memory.index returned {type(value).__name__}, not None (session "
                                          f"{x.index})", stage="index", conversation=conv.id)
                self._count("index", run=1)
        except SandboxError as e:
            raise ProgramRunError(f"{e.kind}: {e.reason}", stage="index", conversation=conv.id) from None

    def _plan(self, questions: list[QAItem], info: ProgramInfo) -> list[dict]:
        s = self.settings
        fields = [f.to_dict() for f in info.query_fields]
        keys = [stable_hash("plan", self.stage_hash["plan"], self.runner.stage_settings("plan"), fields, q.question,
                            q.question_date) for q in questions]
        cached = [self.cache.get_json("plan", k) for k in keys]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("plan", run=len(todo), reused=len(questions) - len(todo))
        if todo and s.plan_mode == "llm":
            batch = [planning_messages(info.planning_instruction, questions[i].question, questions[i].question_date,
                                       info.query_fields) for i in todo]
            comps = self._generate("plan", batch, GenerationParams(max_new_tokens=s.plan_max_new_tokens), "plan",
                                   bounded(query_schema(info.query_fields), s.constrained_max_chars,
                                           s.constrained_max_items) if s.constrained else None)
        else:
            comps = [None] * len(todo)
        for i, comp in zip(todo, comps):
            value = None
            if comp is not None:
                try:  # a cut-off plan is a failed plan: the fallback query is used
                    value = {"query": dataclasses.asdict(parse_structured(require_complete(comp, "plan"),
                                                                          info.query_class(), many=False)),
                             "ok": True}
                except (StructuredOutputError, TruncatedOutputError):
                    value = None
            if value is None:
                value = {"query": text_query(info.query_fields, questions[i].question), "ok": s.plan_mode == "question"}
            self.cache.put_json("plan", keys[i], value)
            cached[i] = value
        self._add("plan_failures", sum(1 for c in cached if not c["ok"]))
        return cached

    def _retrieve(self, conv_id: str, index_key: str, queries: list[dict | None], info: ProgramInfo, memory,
                  what: str) -> list[dict]:
        keys = [stable_hash("retrieve", self.stage_hash["retrieve"], self.runner.stage_settings("retrieve"), index_key, q)
                for q in queries]
        cached = [self.cache.get_json("retrieve", k) for k in keys]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("retrieve", run=len(todo), reused=len(queries) - len(todo))
        for i in tqdm(todo, desc=f"retrieve {conv_id} ({what})", disable=not self.settings.progress, leave=False,
                      unit="query"):
            value = {"text": "", "error": None}
            if queries[i] is None:
                value["error"] = "the Query schema has no str or list[str] field to carry the text"
            else:
                try:
                    out = memory().retrieve(queries[i])
                    if not isinstance(out, str):
                        value["error"] = f"retrieve returned {type(out).__name__}, not str"
                    elif len(out) > OUT_CHAR_BUDGET:
                        value["error"] = f"retrieve returned {len(out)} characters > {OUT_CHAR_BUDGET}"
                    else:
                        value["text"] = out
                except ProgramRaised as e:
                    value["error"] = f"retrieve raised {e.reason}"[:300]
                except SandboxError as e:
                    raise ProgramRunError(f"{e.kind}: {e.reason}", stage="retrieve", conversation=conv_id) from None
            self.cache.put_json("retrieve", keys[i], value)
            cached[i] = value
        if what == "questions":
            self._add("retrieve_errors", sum(1 for c in cached if c["error"]))
        return cached

    def _answer(self, questions: list[QAItem], info: ProgramInfo, retrieved: list[str]) -> list[str | None]:
        if not self.scorer.needs_prediction:
            return [None] * len(questions)
        s = self.settings
        keys = [stable_hash("answer", self.stage_hash["answer"], self.runner.stage_settings("answer"), q.question,
                            q.question_date, r)
                for q, r in zip(questions, retrieved)]
        cached = [self.cache.get_json("answer", k) for k in keys]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("answer", run=len(todo), reused=len(questions) - len(todo))
        if todo:
            with self.runner.model_lock:
                calls0 = self.rt.calls_snapshot()
                answers = answer_items(self.task, [(questions[i].question, retrieved[i], questions[i].question_date)
                                                   for i in todo],
                                       GenerationParams(max_new_tokens=s.answer_tokens),
                                       system_prompt=info.answer_instruction, max_context_chars=OUT_CHAR_BUDGET,
                                       batch_size=max(1, self.rt.batch_size))
                self._add_calls("answer", sum(self.rt.calls_since(calls0)["calls"].values()))
            for i, a in zip(todo, answers):
                cached[i] = a
                self.cache.put_json("answer", keys[i], cached[i])
        return cached

    def _score(self, questions: list[QAItem], retrieved: list[str], preds: list[str | None],
               conv: Conversation) -> list[dict]:
        """``{"score", "judge", "detail"}`` per question (judge requests and replies of an LLM
        scorer, a grounded scorer's parts). The key holds what the scorer reads: the retrieved
        text when it scores no prediction, the question id and rubric when there is a rubric or
        an LLM judge, the evidence ids and the conversation's text when it reads the source."""
        grounded = getattr(self.scorer, "needs_source", False)
        source = stable_hash("source", *(t.render() for x in conv.sessions for t in x.turns)) if grounded else None
        keys = [stable_hash("score", self.stage_hash["score"], self.runner.stage_settings("score"), q.question, q.answer,
                            q.category, p, r if not self.scorer.needs_prediction else None,
                            *([q.id, list(q.rubric)] if q.rubric or self.settings.scorer == "llm" else []),
                            *([list(q.evidence), source] if grounded else []))
                for q, r, p in zip(questions, retrieved, preds)]
        cached = [self.cache.get_json("score", k) for k in keys]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("score", run=len(todo), reused=len(questions) - len(todo))
        if todo:
            with self.runner.model_lock:
                calls0 = self.rt.calls_snapshot()
                values, last = score_items(self.scorer, [questions[i] for i in todo], [retrieved[i] for i in todo],
                                           [preds[i] for i in todo], conv)
                judged = self.rt.calls_since(calls0)["calls"].get("judge", 0)
            if len(last) != len(todo):
                last = [None] * len(todo)
            for i, v, j in zip(todo, values, last):
                cached[i] = {"score": float(v), "judge": j.calls if j is not None else [],
                             "detail": j.detail if j is not None else None}
                if j is None or not j.unreadable:  # an unreadable judge reply is asked again next time
                    self.cache.put_json("score", keys[i], cached[i])
            self._add_calls("score", judged)
        return cached
