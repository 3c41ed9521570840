"""The ``coder`` proposer: an LLM behind any backend spec writes SEARCH/REPLACE edits.

Source: docs/design.md § "Capability-driven evolution" (proposers) and PrisMem's appendix on the
proposer prompt. Protocol of one proposal (every turn is kept in ``transcript``):

1. the prompt (:func:`build_prompt`): the program interface, the parent's source with line
   numbers, the target and its diagnostics, the compact cases, and the lineage (ancestors
   with score changes, this target's failed attempts);
2. the answer is parsed (:func:`memgym.evolution.search.edits.parse_response`) and applied strictly;
   on a miss or malformed blocks ONE repair turn sends the error (with the closest region);
3. if that fails too, one whole-file request; if no usable file comes back the proposal
   fails with its reason.

:meth:`CoderProposer.revise` is the loop's single "validation failed" turn: it sends the
verdict and applies the answer to the failing child. Nothing here raises for model output.
"""
from __future__ import annotations

import hashlib
import random
from typing import Callable

from memgym.llm.base import Completion

from memgym.evolution.search.edits import EditError, Proposal, apply_edits, parse_response
from memgym.evolution.search.proposers.base import ProposalInput, ProposalResult, ProposerError

INTERFACE = """A memory program is ONE Python module that defines:
- dataclasses `MemoryUnit` and `Query` with JSON-compatible fields (str, int, float, bool, list[str], Optional);
- non-empty strings EXTRACTION_INSTRUCTION, PLANNING_INSTRUCTION, ANSWER_INSTRUCTION;
- class Memory with __init__(self, toolkit), index(self, units, session) -> None (units: list of MemoryUnit of one
  session; session: {"index", "id", "date", "date_text"}) and retrieve(self, query) -> str of at most
  OUT_CHAR_BUDGET = 16000 characters.
Stages: extract -> index -> plan (Query) -> retrieve -> answer. toolkit.embed(texts) returns L2-normalised vectors;
toolkit.llm(prompt, max_tokens) is budgeted; toolkit.cosine_topk(vec, matrix, k). Allowed imports: math, re, json,
dataclasses, typing, collections, itertools, functools, heapq, bisect, datetime, statistics, string, textwrap,
difflib, enum, abc, copy, numpy, operator, random, calendar, unicodedata. No file, network or process access.
Validation indexes ~2,000 units in 100 sessions and must answer queries within seconds; the sizes of the splits
that score the program are stated under "What scores your program"."""

FORMAT = """Answer with one or more edit blocks, each copying the SEARCH lines EXACTLY from the program:
<<<<<<< SEARCH
(existing lines)
=======
(new lines)
>>>>>>> REPLACE
Start with one line of explanation. Keep the contract names."""

Chat = Callable[[list[dict]], Completion]
"""``chat(messages) -> Completion``: the reply, its token counts (0 for a cache hit) and whether
they are estimates (:class:`memgym.llm.base.Completion`)."""


def reply_sha256(text: str) -> str:
    """The sha256 of a reply's UTF-8 text, kept with it in the transcript (``replay`` checks it)."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def numbered(source: str) -> str:
    """``source`` with ``NNN| `` line numbers (for the prompt only; SEARCH text omits them)."""
    return "\n".join(f"{i:4d}| {line}" for i, line in enumerate(source.splitlines(), 1))


def _diag_table(diag: dict) -> str:
    """The diagnostics table; with a grounded scorer, a ``grounded`` column (share of the retrieved
    tokens inside conversation text) and a warning line when some question got none."""
    g = any("grounded" in d for d in diag.values())
    rows = ["| capability | n | score | d_ext | d_idx | d_ret | unit chars | retrieved chars |" + (" grounded |" if g else ""),
            "|---|---|---|---|---|---|---|---|" + ("---|" if g else "")]

    def f(v):
        return "-" if v is None else f"{v:.3f}" if isinstance(v, float) else str(v)

    for cap, d in diag.items():
        rows.append(f"| {cap} | {f(d.get('n'))} | {f(d.get('score'))} | {f(d.get('d_ext'))} | {f(d.get('d_idx'))} | "
                    f"{f(d.get('d_ret'))} | {f(d.get('unit_chars'))} | {f(d.get('retrieved_chars'))} |"
                    + (f" {f(d.get('grounded'))} |" if g else ""))
    bad = (diag.get("overall") or {}).get("ungrounded")
    if bad:
        rows.append(f"WARNING: for {bad} of {diag['overall'].get('n')} questions the retrieved text holds no run of "
                    "4 words copied from the conversation; the scorer credits none of it.")
    return "\n".join(rows)


def build_prompt(inp: ProposalInput, facts: str = "") -> list[dict]:
    """The chat messages of a proposal (system: role + interface + the run's ``facts``
    (:func:`memgym.evolution.search.proposers.facts.run_facts`) + format; user: the rest)."""
    goal = inp.extra.get("goal") or (
        "Improve the program's overall score (cold start: any component may be the bottleneck)."
        if inp.target is None else
        f"Improve capability {inp.target} (refinement from its specialist) without hurting the others.")
    parts = [f"# Goal\n{goal}", f"# Diagnostics of the parent (train split)\n{_diag_table(inp.diagnostics)}\n"
             "d_ext: evidence kept in units; d_idx: found when the evidence itself is the query; d_ret: found for "
             "the real question (cosine maxima, 0..1, not rates).",
             "# Parent program\n```python\n" + numbered(inp.source) + "\n```"]
    if inp.ancestors:
        parts.append("# Lineage (oldest first)\n" + "\n".join(a.render() for a in inp.ancestors))
    if inp.failed:
        parts.append("# Earlier attempts for this target that were not accepted\n"
                     + "\n".join(a.render() for a in inp.failed))
    if inp.extra.get("integration"):
        parts.append("# Integration material\n" + str(inp.extra["integration"]))
    if inp.cases:
        parts.append("# Diagnostic cases (compact)\n" + "\n\n".join(inp.cases))
    system = ("You improve memory programs for long-term conversational memory.\n\n" + (inp.interface or INTERFACE)
              + "\n\n" + (facts + "\n\n" if facts else "") + FORMAT)
    return [{"role": "system", "content": system}, {"role": "user", "content": "\n\n".join(parts)}]


class CoderProposer:
    """LLM proposer. ``chat``: the model call (see :data:`Chat`); the loop builds it from the
    ``coder_model`` backend spec (:func:`backend_chat`). ``facts``: the run's section of the
    system message (what scores the program, :func:`memgym.evolution.search.proposers.facts.run_facts`).
    ``chat`` raising :class:`ProposerError` stops the run; any other exception fails the proposal."""

    name = "coder"

    def __init__(self, chat: Chat, max_file_chars: int = 60_000, facts: str = ""):
        self.chat = chat
        self.max_file_chars = max_file_chars
        self.facts = facts

    def _turn(self, messages: list[dict], result: ProposalResult) -> str:
        """One model call; the request (every message) and the reply go into the transcript."""
        try:
            reply = self.chat(messages)
        except ProposerError:
            raise
        except Exception as e:  # noqa: BLE001 - a dead server fails the proposal, not the run
            reason = str(e) if isinstance(e, CallFailed) else f"coder call failed: {type(e).__name__}: {e}"
            result.transcript += [{"role": "request", "messages": messages}, {"role": "error", "content": reason}]
            raise CallFailed(reason) from None
        text = reply.text
        result.turns += 1
        result.prompt_tokens += reply.prompt_tokens
        result.completion_tokens += reply.completion_tokens
        result.estimated += int(reply.estimated)
        entry = {"role": "response", "content": text, "sha256": reply_sha256(text),
                 "prompt_tokens": reply.prompt_tokens, "completion_tokens": reply.completion_tokens}
        if reply.cached or reply.estimated:
            entry["cached" if reply.cached else "estimated"] = True
        result.transcript += [{"role": "request", "messages": messages}, entry]
        return text

    def _apply(self, base: str, text: str) -> tuple[str | None, str, Proposal | None]:
        """(child, error, parsed): child None with the error when the answer is unusable."""
        try:
            prop = parse_response(text)
        except EditError as e:
            return None, str(e), None
        if prop.kind == "edits":
            try:
                return apply_edits(base, prop.edits), "", prop
            except EditError as e:
                return None, str(e), prop
        if prop.kind == "file":
            if len(prop.whole_file) > self.max_file_chars:
                return None, f"whole file has {len(prop.whole_file)} characters > {self.max_file_chars}", prop
            return prop.whole_file, "", prop
        return None, "the answer has no SEARCH/REPLACE block and no ```python file defining class Memory", prop

    def _run(self, base: str, messages: list[dict], result: ProposalResult) -> ProposalResult:
        try:
            text = self._turn(messages, result)
            child, err, prop = self._apply(base, text)
            if child is None:
                messages = messages + [{"role": "assistant", "content": text},
                                       {"role": "user", "content": f"Your edit could not be applied: {err}\n\n"
                                                                   f"Answer again with corrected blocks.\n{FORMAT}"}]
                text = self._turn(messages, result)
                child, err2, prop = self._apply(base, text)
                if child is None:
                    messages = messages + [{"role": "assistant", "content": text},
                                           {"role": "user", "content": f"That failed too: {err2}\n\nAnswer with the "
                                                                       "COMPLETE new program in one ```python block."}]
                    text = self._turn(messages, result)
                    child, err3, prop = self._apply(base, text)
                    if child is None or prop is None or prop.kind != "file":
                        result.ok = False
                        result.reason = f"no usable program after repair and whole-file turns: {err3 or 'not a file'}"
                        return result
        except CallFailed as e:
            result.ok, result.reason = False, str(e)
            return result
        result.ok, result.source = True, child
        result.edits = list(prop.edits) if prop.kind == "edits" else []
        result.whole_file = prop.kind == "file"
        first = text.strip().splitlines()[0] if text.strip() else ""
        result.description = first[:200] if not first.startswith("<<<<<<<") and not first.startswith("```") else ""
        return result

    def propose(self, inp: ProposalInput, rng: random.Random) -> ProposalResult:
        return self._run(inp.source, build_prompt(inp, self.facts), ProposalResult(False))

    def revise(self, inp: ProposalInput, result: ProposalResult, verdict: str,
               rng: random.Random) -> ProposalResult | None:
        messages = [build_prompt(inp, self.facts)[0], {"role": "user", "content": (
            f"This program failed validation: {verdict}\n\n```python\n{numbered(result.source)}\n```\n\n"
            f"Fix it with edit blocks against THIS program.\n{FORMAT}")}]
        again = self._run(result.source, messages, ProposalResult(False))
        again.transcript = result.transcript + again.transcript
        again.turns += result.turns
        again.prompt_tokens += result.prompt_tokens
        again.completion_tokens += result.completion_tokens
        again.estimated += result.estimated
        return again


class CallFailed(Exception):
    """A failed model call: the proposal fails with ``str(self)`` as its reason (a chat may
    raise it to fail a proposal with an exact reason, as :mod:`.replay` does)."""


def backend_chat(backend, max_new_tokens: int = 4096, temperature: float = 0.7) -> Chat:
    """A :data:`Chat` over an :class:`memgym.llm.base.Backend` (one conversation per call)."""
    from memgym.llm.base import GenerationParams

    params = GenerationParams(max_new_tokens=max_new_tokens, temperature=temperature)

    def chat(messages):
        c = backend.generate([messages], params)[0]
        return Completion(c.text, 0, 0, c.finish_reason, cached=True) if c.cached else c

    return chat
