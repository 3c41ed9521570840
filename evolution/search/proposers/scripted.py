"""The scripted proposer (tests, demos): a :class:`CoderProposer` whose model is a fixed script.

``script``: a list with one entry per proposal (the loop's round number r uses entry
``(r - 1) % len(script)``); an entry is a string or a list of strings, the answers to that
proposal's successive turns (first answer, repair, whole-file request, validation revise).
A turn beyond its entry answers with prose, which fails the proposal with its reason. So the
scripted path exercises exactly the coder's parsing, strict application, repair and revise
logic, with no model. Token counts are whitespace words.

A script file (recipe field ``script``) is JSON: ``{"proposals": [entry, ...]}``.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

from memgym.evolution.search.proposers.base import ProposalInput, ProposalResult
from memgym.evolution.search.proposers.coder import CoderProposer
from memgym.llm.base import Completion

EXHAUSTED = "(the script has no answer for this turn)"


def load_script(path: str | Path) -> list:
    """The ``proposals`` list of a script file (ValueError naming the file when malformed)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as e:
        raise ValueError(f"cannot read proposer script {path}: {e}") from None
    props = data.get("proposals") if isinstance(data, dict) else None
    if not isinstance(props, list) or not props or not all(isinstance(p, (str, list)) for p in props):
        raise ValueError(f"proposer script {path}: expected {{\"proposals\": [str or [str, ...], ...]}} (non-empty)")
    return props


class ScriptedProposer(CoderProposer):
    """See the module doc."""

    name = "scripted"

    def __init__(self, script: list):
        if not script:
            raise ValueError("ScriptedProposer needs a non-empty script")
        self.script = [[e] if isinstance(e, str) else list(e) for e in script]
        self._entry: list[str] = []
        self._turn_no = 0
        super().__init__(self._chat)

    def _chat(self, messages: list[dict]) -> Completion:
        text = self._entry[self._turn_no] if self._turn_no < len(self._entry) else EXHAUSTED
        self._turn_no += 1
        return Completion(text, sum(len(m["content"].split()) for m in messages), len(text.split()))

    def propose(self, inp: ProposalInput, rng: random.Random) -> ProposalResult:
        self._entry = self.script[(int(inp.extra.get("round", 1)) - 1) % len(self.script)]
        self._turn_no = 0
        return super().propose(inp, rng)
