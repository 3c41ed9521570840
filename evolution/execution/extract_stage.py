"""The extract stage of one program evaluation: the four extraction modes (``turns``,
``instruction``, a trained extractor's bank entries, an ``expert:`` replay), memory
construction for trained extractors, and the extraction statistics (units, failures,
segments). :class:`ExtractStage` is a :class:`~memgym.evolution.execution.stage_context.StageContext`:
the settings, cache, runtime, counters, stage hashes and helpers it uses are that base's, set
in its ``__init__``; :class:`memgym.evolution.execution.run_state.RunState` adds the later stages."""

from __future__ import annotations

import dataclasses

from memgym.data_synth.extractors import check_coverage, make_extractor
from memgym.evolution.execution.results import ConversationTrace, ProgramRunError
from memgym.evolution.execution.stage_context import StageContext
from memgym.evolution.execution.stage_cache import session_fingerprint, stable_hash
from memgym.llm.base import GenerationParams, TruncatedOutputError, require_complete
from memgym.llm.structured import bounded
from memgym.memory_bank.contract import (FieldSpec, ProgramInfo, StructuredOutputError, parse_structured, session_entries,
                                 schema_hint, turn_entries, units_from_entries)
from memgym.memory_bank.actions import MANAGERS
from memgym.memory_bank.record_schemas import units_schema
from memgym.memory_bank.schema import Conversation, Session


def extraction_messages(instruction: str, session: Session, speakers: tuple[str, ...],
                        unit_fields: tuple[FieldSpec, ...]) -> list[dict]:
    """Instruction-mode extraction prompt (PrisMem style): system = the program's
    ``EXTRACTION_INSTRUCTION``; user = the session date, speakers, transcript (``[id] speaker:
    text`` lines) and the unit schema. The answer is parsed as a JSON list of MemoryUnit."""
    date = session.date_text or (session.date.isoformat() if session.date else "unknown")
    user = (f"Session {session.index} date: {date}\n"
            f"Speakers: {', '.join(speakers)}\n\nTranscript:\n{session.transcript()}\n\n"
            f"Answer with a JSON list of memory units; each unit is an object with the fields "
            f"{schema_hint(unit_fields)}.")
    return [{"role": "system", "content": instruction}, {"role": "user", "content": user}]


class ExtractStage(StageContext):
    """The extract stage over a :class:`StageContext`: :meth:`_extract` gives a conversation's
    units per session (cached per session) and counts them into ``extraction_stats``."""

    def _extract(self, conv: Conversation, info: ProgramInfo) -> tuple[ConversationTrace, list[str]]:
        s = self.settings
        sessions = list(conv.sessions)
        unit_fields = [f.to_dict() for f in info.unit_fields]
        settings = self.runner.stage_settings("extract")
        if s.extraction_mode in ("instruction", "turns"):
            inputs = [unit_fields, list(conv.speakers)]
            keys = [stable_hash("extract", self.stage_hash["extract"], settings, inputs, session_fingerprint(x))
                    for x in sessions]
        else:
            construct_key = stable_hash("construct", settings, self.rt.embedder.model_id, conv.id,
                                        [session_fingerprint(x) for x in sessions])
            keys = [stable_hash("extract", self.stage_hash["extract"], construct_key, unit_fields, x.index)
                    for x in sessions]
        cached = [self.cache.get_json("extract", k) for k in keys]
        todo = [i for i, c in enumerate(cached) if c is None]
        self._count("extract", run=len(todo), reused=len(sessions) - len(todo))
        if todo:
            chosen = [sessions[i] for i in todo]
            if s.extraction_mode == "instruction":
                fresh = self._extract_instruction(conv, info, chosen)
            elif s.extraction_mode == "turns":
                fresh = self._extract_turns(conv, info, chosen)
            else:
                fresh = self._extract_bank(conv, info, chosen, construct_key)
            for i, value in zip(todo, fresh):
                self.cache.put_json("extract", keys[i], value)
                cached[i] = value
        trace = ConversationTrace(conv, [c["units"] for c in cached], [x.index for x in sessions])
        trace.extract_failures = sum(1 for c in cached if c["error"])
        with self.lock:
            self._extraction_stats(sessions, cached, trace)
        return trace, keys

    def _extraction_stats(self, sessions, cached, trace) -> None:
        stats = self.extraction_stats
        stats["sessions"] += len(sessions)
        stats["segments"] += sum(c.get("segments", 1) for c in cached)
        stats["units"] += sum(len(c["units"]) for c in cached)
        stats["format_failures"] += trace.extract_failures
        for c in cached:
            for m in c.get("failed_managers", []):
                stats["manager_failures"][m] = stats["manager_failures"].get(m, 0) + 1
                stats["failed_manager_outputs"] += 1
            for m, n in c.get("attempts", {}).items():
                stats.setdefault("manager_attempts", {})[m] = stats.setdefault("manager_attempts", {}).get(m, 0) + n
            for t in c.get("failure_types", []):
                stats.setdefault("failure_types", {})[t] = stats.setdefault("failure_types", {}).get(t, 0) + 1
        if any("attempts" in c for c in cached):  # a trained extractor's bank: what the eval report shows
            stats.setdefault("empty_sessions", []).extend(
                f"{trace.conversation.id}/{x.index}" for x, c in zip(sessions, cached) if c.get("empty"))
            stats.setdefault("segments_by_conversation", {})[trace.conversation.id] = {
                "sessions": len(sessions), "segments": sum(c.get("segments", 1) for c in cached),
                "split_sessions": {str(x.index): c["segments"] for x, c in zip(sessions, cached)
                                   if c.get("segments", 1) > 1}}

    def _extract_turns(self, conv, info: ProgramInfo, sessions) -> list[dict]:
        """``turns`` mode: every dialogue turn is one unit (no model call), mapped onto the
        program's MemoryUnit like a trained extractor's entries (:func:`turn_entries`)."""
        out = []
        for x in sessions:
            try:
                units = units_from_entries(turn_entries(x), info.unit_class())
            except StructuredOutputError as e:
                raise ProgramRunError(f"dialogue turns do not fit the program's MemoryUnit: {e}", stage="extract",
                                      conversation=conv.id) from None
            out.append({"units": [dataclasses.asdict(u) for u in units], "error": None})
        return out

    def _extract_instruction(self, conv, info: ProgramInfo, sessions) -> list[dict]:
        batch = [extraction_messages(info.extraction_instruction, x, conv.speakers, info.unit_fields) for x in sessions]
        s = self.settings
        schema = bounded(units_schema(info.unit_fields), s.constrained_max_chars, s.constrained_max_items) \
            if s.constrained else None
        comps = self._generate("extract", batch, GenerationParams(max_new_tokens=self.settings.extract_max_new_tokens),
                               f"extract {conv.id}", schema)
        out = []
        for comp in comps:
            try:  # a cut-off extraction is a format failure (error type truncated), never half the units
                units = parse_structured(require_complete(comp, "extraction"), info.unit_class(), many=True)
                out.append({"units": [dataclasses.asdict(u) for u in units], "error": None})
            except TruncatedOutputError as e:
                out.append({"units": [], "error": f"truncated: {e}"})
            except StructuredOutputError as e:
                out.append({"units": [], "error": str(e)[:300]})
        return out

    def _extract_bank(self, conv, info: ProgramInfo, sessions, construct_key: str) -> list[dict]:
        """Extractor/expert mode: build the bank once per conversation (cached under
        ``construct_key``), then map each session's new/updated entries to units."""
        snaps = self.cache.get_json("construct", construct_key)
        if snaps is None:
            snaps = self._construct(conv)
            self.cache.put_json("construct", construct_key, snaps)
        by_index = {x.index: i for i, x in enumerate(conv.sessions)}
        deletions = any(f.name == "deleted" for f in info.unit_fields)
        out = []
        for x in sessions:
            i = by_index[x.index]
            before = snaps["banks"][i - 1] if i > 0 else None
            entries = session_entries(before, snaps["banks"][i], x.index, x.date.date().isoformat() if x.date else None,
                                      deletions=deletions)
            try:
                units = units_from_entries(entries, info.unit_class())
            except StructuredOutputError as e:
                raise ProgramRunError(f"bank entries do not fit the program's MemoryUnit: {e}", stage="extract",
                                      conversation=conv.id) from None
            failed = [f[1] for f in snaps["failures"] if f[0] == x.index]
            out.append({"units": [dataclasses.asdict(u) for u in units], "error": None, "failed_managers": failed,
                        "failure_types": [f[2] for f in snaps["failures"] if f[0] == x.index],
                        "attempts": snaps["attempts"].get(str(x.index), {}),
                        "empty": x.index in snaps.get("empty_sessions", []),
                        "segments": snaps.get("segments", {}).get(str(x.index), 1)})
        return out

    def _construct(self, conv: Conversation) -> dict:
        from memgym.memory_bank.construct import construct

        extractor = make_extractor(self.settings.extractor, self.rt, self.settings.extractor_max_new_tokens,
                                   constrained=self.settings.constrained, max_chars=self.settings.constrained_max_chars,
                                   max_items=self.settings.constrained_max_items,
                                   context_tokens=self.settings.extractor_context_tokens,
                                   segment_tokens=self.settings.extractor_segment_tokens)
        check_coverage(extractor, [conv])
        with self.runner.model_lock:
            calls0 = self.rt.calls_snapshot()
            built = construct(conv, extractor, embedder=self.rt.embedder, progress=self.settings.progress)
        self._add_calls("extract", self.rt.calls_since(calls0)["calls"].get("extractor", 0))
        return {"banks": built.snapshots, "failures": [[f.session, f.manager, f.error_type] for f in built.failures],
                # every manager speaks once per segment of a session with turns
                "attempts": {str(k): {m: 0 if k in built.empty_sessions else v for m in MANAGERS}
                             for k, v in built.segments.items()},
                "empty_sessions": list(built.empty_sessions),
                "segments": {str(k): v for k, v in built.segments.items()}}
