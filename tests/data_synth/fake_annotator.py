"""A deterministic fake capability annotator (test fixture and the closing note's figure).

:func:`rule_reply` labels a question from the annotator prompt's text alone, by keyword rules
(a stand-in for an LLM; it reads what the real annotator reads: question, reference answer,
evidence): "when"/dates -> T; "would"/"likely"/"favorite"/"prefer" -> P; "how many"/"both"/
"what ... and" -> M; a reference answer that says nothing is known -> A; else F. Evidence from
two or more sessions ("D3:", "D7:" prefixes) adds M as a secondary. :func:`serve_annotator`
serves it over :func:`memgym.llm.server.serve_backend` (``requests_total`` counts calls).
"""
from __future__ import annotations

import json
import re

from memgym.llm.server import serve_backend
from tests.helpers import ScriptedBackend


def rule_label(user: str) -> dict:
    q = re.search(r"Question: (.*)", user).group(1).lower()
    ans = re.search(r"Reference answer: (.*)", user).group(1).lower()
    sessions = set(re.findall(r"^\[?D(\d+):", user, re.M))
    if not ans.strip() or "not mentioned" in ans or "no information" in ans:
        primary = "A"
    elif q.startswith("when") or re.search(r"\b(date|year|month|how long|before|after)\b", q):
        primary = "T"
    elif re.search(r"\b(would|likely|favorite|favourite|prefer|enjoy)\b", q):
        primary = "P"
    elif q.startswith("how many") or re.search(r"\bboth\b", q):
        primary = "M"
    else:
        primary = "F"
    secondary = ["M"] if len(sessions) >= 2 and primary != "M" else []
    return {"primary": primary, "secondary": secondary}


def rule_reply(messages, params=None) -> str:
    user = [m for m in messages if m["role"] == "user"][0]["content"]
    return json.dumps(rule_label(user))


def serve_annotator(model: str = "fake-annotator", **kw):
    """(server, spec) of the rule annotator behind an OpenAI-compatible server on 127.0.0.1."""
    server, _, url = serve_backend(ScriptedBackend(rule_reply, model_id=model), served_model_name=model, **kw)
    return server, f"openai:{url}#{model}"
