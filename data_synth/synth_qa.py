"""Synthetic session QA (``memgym synth qa``): J questions per session written by an expert model,
validated and appended to a resumable JSONL file; or the benchmark's own QA bucketed by session.

Source: ``docs/design.md`` § "Dense session reward and ADRPO" (J = 5: ~50% single-session, 30%
multi-session, 20% temporal, with evidence turn ids) and MemBuilder (arXiv 2601.05488, §3.4.1,
Fig. 14). Prompt, schema and validation (rejects counted by reason; items beyond a kind's quota
are ``surplus``): :mod:`memgym.data_synth.synth_qa_prompt`. A session short of J is asked again with the
reasons, up to ``max_tries`` times; ``missing`` counts what is still short.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from tqdm.auto import tqdm

from memgym.data_synth.jsonl import ResumableJsonl
from memgym.data_synth.qa_format import KINDS
from memgym.data_synth.synth_qa_prompt import (QA_SCHEMA, REASON_HINTS, REJECT_REASONS, build_qa_messages, earlier_excerpts,
                                        kind_quota, validate_output)
from memgym.llm.base import CallTally, GenerationParams
from memgym.memory_bank.schema import Conversation

__all__ = ["bucket_benchmark_qa", "SynthQAStats", "synth_qa"]


def bucket_benchmark_qa(conv: Conversation, n_sessions: int | None = None) -> tuple[dict[int, list[dict]], int]:
    """``({session index: [item, ...]}, dropped)``: the benchmark's QA by the session of its latest
    evidence turn, over the first ``n_sessions``; items without valid evidence there are dropped."""
    limit = n_sessions or len(conv.sessions)
    kept_sessions = {s.index for s in conv.sessions[:limit]}
    out: dict[int, list[dict]] = {s: [] for s in sorted(kept_sessions)}
    dropped = 0
    for q in conv.questions:
        sessions = conv.evidence_sessions(q)
        if not sessions or max(sessions) not in kept_sessions:
            dropped += 1
            continue
        item = {"id": q.id, "question": q.question, "answer": q.answer, "evidence": list(q.evidence),
                "kind": q.category}
        if q.capability is not None:
            item["capability"] = q.capability.value
        out[max(sessions)].append(item)
    return out, dropped


@dataclass
class SynthQAStats(CallTally):
    """Accounting of one ``synth qa`` run. Tokens are the expert's, for calls that reached
    the model (cache hits are counted in ``cached_completions`` and cost nothing)."""

    sessions_written: int = 0
    sessions_resumed: int = 0
    sessions_retried_empty: int = 0
    sessions_empty: int = 0
    sessions_short: int = 0
    attempts: int = 0
    accepted: int = 0
    generated_items: int = 0
    rejected: Counter = field(default_factory=Counter)
    surplus: int = 0
    benchmark_dropped: int = 0
    repaired_bytes: int = 0

    def to_json(self) -> dict:
        """Plain dict; ``rejected_share`` = rejected / (rejected + accepted + surplus) items,
        with ``unparsable`` outputs counted as one item each."""
        total = sum(self.rejected.values()) + self.accepted + self.surplus
        d = {k: v for k, v in self.__dict__.items() if k != "rejected"}
        d["rejected"] = {r: self.rejected.get(r, 0) for r in REJECT_REASONS}
        d["rejected_total"] = sum(self.rejected.values())
        d["rejected_share"] = round(sum(self.rejected.values()) / total, 4) if total else 0.0
        d["rejected_share_by_reason"] = {r: round(self.rejected.get(r, 0) / total, 4) if total else 0.0
                                         for r in REJECT_REASONS}
        return d


def _session_key(rec: dict):
    return (rec.get("conversation_id"), rec.get("session"))


def run_settings(source: str, backend, j: int) -> dict:
    """The settings a line records and a resume must match: ``source``, ``expert`` id and ``j``."""
    if source == "benchmark":
        return {"source": "benchmark", "expert": None, "j": None}
    return {"source": "expert", "expert": getattr(backend, "model_id", "?"), "j": j}


def _line_settings(rec: dict) -> dict:
    if rec.get("source") == "benchmark":
        return {"source": "benchmark", "expert": None, "j": None}
    j = rec.get("j")
    if j is None and isinstance(rec.get("qa"), list) and isinstance(rec.get("missing"), int):
        j = len(rec["qa"]) + rec["missing"]  # lines written before j was recorded
    return {"source": rec.get("source"), "expert": rec.get("expert"), "j": j}


def check_resume_settings(records: list[dict], want: dict, out_path) -> None:
    """ValueError naming the first line of ``records`` written with settings other than ``want``."""
    for no, rec in enumerate(records, 1):
        have = _line_settings(rec)
        if have != want:
            diff = ", ".join(f"{k} {have[k]!r} (now {want[k]!r})" for k in want if have[k] != want[k])
            raise ValueError(f"{out_path}: line {no} was written with other settings: {diff}; resume with the same "
                             "--source/--expert/--j, or write to another --out")


def synth_qa(convs: list[Conversation], out_path, *, source: str = "expert", backend=None, embedder=None,
             j: int = 5, max_tries: int = 3, concurrency: int = 8, n_sessions: int | None = None,
             params: GenerationParams | None = None, progress: bool = True, constrained: bool = False) -> SynthQAStats:
    """Write one line per session of ``convs`` to ``out_path`` (resumable, :mod:`memgym.data_synth.jsonl`).

    source "expert": ``backend`` writes ``j`` questions per session, ``concurrency`` sessions per
    ``generate``; ``embedder`` retrieves earlier excerpts and finds near-duplicates;
    ``constrained`` decodes under :data:`QA_SCHEMA`; ``params`` default greedy, 1024 tokens.
    source "benchmark": :func:`bucket_benchmark_qa` (callers refuse test splits). A resume with
    other settings is refused; expert sessions with no question are redone. ValueError for bad
    arguments.
    """
    if source not in ("expert", "benchmark"):
        raise ValueError(f"source must be expert or benchmark, got {source!r}")
    if max_tries < 1 or concurrency < 1:
        raise ValueError(f"max_tries and concurrency must be >= 1, got {max_tries}, {concurrency}")
    if source == "expert" and (backend is None or embedder is None):
        raise ValueError("source 'expert' needs an expert backend and an embedder")
    kind_quota(j, False)  # validates j
    params = params or GenerationParams(max_new_tokens=1024, temperature=0.0)
    stats = SynthQAStats()
    want = run_settings(source, backend, j)
    with ResumableJsonl(out_path, _session_key) as log:
        stats.repaired_bytes = log.repaired_bytes
        check_resume_settings(log.records, want, out_path)
        # a session that came back with no question is redone (e.g. with a higher max_tries)
        stats.sessions_retried_empty = log.drop([_session_key(r) for r in log.records
                                                 if r.get("source") == "expert" and not r.get("qa")])
        for conv in tqdm(convs, desc="synth qa", unit="conv", disable=not progress):
            sessions = conv.sessions[:n_sessions] if n_sessions else conv.sessions
            todo = [s for s in sessions if (conv.id, s.index) not in log.done]
            stats.sessions_resumed += len(sessions) - len(todo)
            if source == "benchmark":
                buckets, dropped = bucket_benchmark_qa(conv, n_sessions)
                stats.benchmark_dropped += dropped
                for s in todo:
                    log.append({"conversation_id": conv.id, "session": s.index, "date": s.date_text,
                                "qa": buckets.get(s.index, []), "source": "benchmark"})
                    stats.sessions_written += 1
                    stats.sessions_empty += not buckets.get(s.index)
                continue
            for i in range(0, len(todo), concurrency):
                for line in _generate_chunk(conv, todo[i: i + concurrency], backend, embedder, j, max_tries,
                                            params, stats, constrained):
                    log.append(line)
                    stats.sessions_written += 1
                    stats.sessions_empty += not line["qa"]
    return stats


def _generate_chunk(conv, chunk, backend, embedder, j, max_tries, params, stats, constrained=False) -> list[dict]:
    idx = conv.turn_index
    state = {s.index: {"kept": [], "feedback": "", "tries": 0, "rejected": Counter(),
                       "quota": kind_quota(j, s.index > conv.sessions[0].index),
                       "excerpts": earlier_excerpts(conv, s, embedder)} for s in chunk}
    for _ in range(max_tries):
        pending = []
        for s in chunk:
            st = state[s.index]
            left = {k: st["quota"][k] - sum(q["kind"] == k for q in st["kept"]) for k in KINDS}
            if sum(left.values()) > 0:
                pending.append((s, left))
        if not pending:
            break
        batch = [build_qa_messages(conv, s, left, state[s.index]["excerpts"], state[s.index]["kept"],
                                   state[s.index]["feedback"]) for s, left in pending]
        completions = (backend.generate(batch, params, schemas=[QA_SCHEMA] * len(batch)) if constrained
                       else backend.generate(batch, params))
        stats.attempts += len(batch)
        for (s, left), comp in zip(pending, completions):
            st = state[s.index]
            st["tries"] += 1
            stats.book(comp)
            new, counts = validate_output(comp.text, conv, s, left, st["kept"], embedder, idx)
            st["kept"] += new
            stats.accepted += len(new)
            stats.surplus += counts.pop("surplus", 0)
            stats.generated_items += len(new) + sum(counts.values())
            stats.rejected.update(counts)
            st["rejected"].update(counts)
            # the attempt number keeps every retry a new prompt (a cached greedy answer would repeat itself)
            st["feedback"] = (f"(attempt {st['tries']}) was rejected: " + "; ".join(
                f"{n} item(s) with {REASON_HINTS[r]}" for r, n in counts.items())) if counts else ""
    lines = []
    for s in chunk:
        st = state[s.index]
        order = {k: i for i, k in enumerate(KINDS)}
        qa = sorted(st["kept"], key=lambda q: order[q["kind"]])
        missing = j - len(qa)
        stats.sessions_short += missing > 0
        lines.append({"conversation_id": conv.id, "session": s.index, "date": s.date_text, "qa": qa,
                      "source": "expert", "expert": getattr(backend, "model_id", "?"), "j": j, "tries": st["tries"],
                      "missing": missing, "rejected": dict(st["rejected"])})
    return lines

