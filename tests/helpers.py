"""Test helpers shared by every package's tests.

:class:`ScriptedBackend` implements :class:`memgym.llm.base.Backend` without a model: answers come
from a list (consumed in order) or a callable ``(messages, params) -> str``. :class:`FaultyServer`
is the builtin server with injected delays and failures (``serve_backend(server_class=...)``).
:func:`planted_policy` writes the tiny model with a planted valid manager output (ADRPO tests);
:func:`memgym_launch` runs ``memgym launch`` in a subprocess (multi-process tests).
"""
from __future__ import annotations

import dataclasses
import json
import math
import re
import time
from collections.abc import Callable
from contextlib import contextmanager
from datetime import datetime

from memgym.llm.base import BackendRequestError, Completion, GenerationParams, Messages, check_batch
from memgym.llm.server import BackendHTTPServer, _RequestError
from memgym.memory_bank.schema import Capability, Conversation, QAItem, Session, Turn


class ScriptedBackend:
    """A deterministic Backend for unit tests.

    ``responses``: a list of strings returned one per prompt, in order (running out raises
    :class:`BackendRequestError`), or a callable ``f(messages, params) -> str``.
    Token counts are whitespace word counts (prompt: over all message contents; completion:
    the response, capped at ``params.max_new_tokens`` with ``finish_reason="length"``).
    ``calls`` counts prompts answered; ``seen`` records every (messages, params) received.
    """

    def __init__(self, responses: list[str] | Callable[[Messages, GenerationParams], str], model_id: str = "stub"):
        if not callable(responses) and not isinstance(responses, (list, tuple)):
            raise TypeError(f"ScriptedBackend responses must be a list or a callable, got {type(responses).__name__}")
        self._responses = responses if callable(responses) else list(responses)
        self._next = 0
        self.model_id = model_id
        self.calls = 0
        self.seen: list[tuple[Messages, GenerationParams]] = []

    def _answer(self, messages: Messages, params: GenerationParams) -> str:
        if callable(self._responses):
            return self._responses(messages, params)
        if self._next >= len(self._responses):
            raise BackendRequestError(
                f"ScriptedBackend {self.model_id!r}: script exhausted after {len(self._responses)} responses")
        text = self._responses[self._next]
        self._next += 1
        return text

    def generate(self, batch: list[Messages], params: GenerationParams, schemas=None) -> list[Completion]:
        """``schemas`` (structured outputs) is accepted and recorded in ``schemas_seen``, not applied."""
        check_batch(batch)
        self.schemas_seen = getattr(self, "schemas_seen", []) + [schemas]
        out = []
        for messages in batch:
            text = self._answer(messages, params)
            self.seen.append((messages, params))
            self.calls += 1
            words = text.split()
            reason = "stop"
            if len(words) > params.max_new_tokens:
                words, reason = words[:params.max_new_tokens], "length"
                text = " ".join(words)
            prompt_tokens = sum(len(m["content"].split()) for m in messages)
            out.append(Completion(text=text, prompt_tokens=prompt_tokens, completion_tokens=len(words),
                                  finish_reason=reason))
        return out


_REAL = object()


class FaultyServer(BackendHTTPServer):
    """:class:`memgym.llm.server.BackendHTTPServer` for client tests: every chat completion first waits
    ``delay_s``; the first ``fail_first`` get HTTP ``fail_status`` (type ``server_error``);
    ``usage`` (when given) is sent as the answer's ``usage`` instead of the real counts (None:
    no ``usage`` key), as a misbehaving or hostile server would."""

    def __init__(self, *args, fail_first: int = 0, fail_status: int = 503, delay_s: float = 0.0, usage=_REAL, **kw):
        super().__init__(*args, **kw)
        self.fail_first, self.fail_status, self.delay_s, self.usage = fail_first, fail_status, delay_s, usage
        self._answered = 0

    def chat_completion(self, body: dict) -> dict:
        with self._stats_lock:
            self._answered += 1
            n = self._answered
        time.sleep(self.delay_s)
        if n <= self.fail_first:
            raise _RequestError(self.fail_status, f"injected failure {n}/{self.fail_first}", "server_error")
        out = super().chat_completion(body)
        if self.usage is None:
            del out["usage"]
        elif self.usage is not _REAL:
            out["usage"] = self.usage
        return out


def trainable_state(model) -> dict:
    """{name: detached CPU copy} of every parameter with ``requires_grad`` (the LoRA weights
    for a PEFT model); tests compare it before and after training."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


PLANT_LOGIT = 16.0  # target logit of each planted step; ~9/16 samples are exactly valid at T = 1


def planted_policy(src, out):
    """Copy of the tiny random model with attention/MLP outputs zeroed (each position sees only
    its own token: a bigram model) and an untied LM head that gives the next token of the
    chain a logit of PLANT_LOGIT (random tokens keep their random logits, std ~2.4)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(src))
    model = AutoModelForCausalLM.from_pretrained(str(src))
    chain = (tok("\n", add_special_tokens=False)["input_ids"]
             + tok('{"operations": []}', add_special_tokens=False)["input_ids"] + [tok.eos_token_id])
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        emb = model.model.embed_tokens.weight
        model.lm_head.weight = torch.nn.Parameter(emb.detach().clone())
        model.config.tie_word_embeddings = False
        d = emb.shape[1]
        for i, t in enumerate(chain):
            emb[t] = torch.nn.functional.one_hot(torch.tensor(i), d).float()
        for i in range(len(chain) - 1):  # RMSNorm maps the one-hot to sqrt(d) on axis i
            model.lm_head.weight[chain[i + 1]] = torch.nn.functional.one_hot(torch.tensor(i), d).float() \
                * PLANT_LOGIT / math.sqrt(d)
    model.save_pretrained(str(out))
    tok.save_pretrained(str(out))
    return out


def free_port() -> int:
    """A TCP port free on 127.0.0.1 now (for a launch's rendezvous)."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def memgym_launch(config: str, stage: str, args: list[str], *, threads: str = "1", env: dict | None = None,
                  timeout: int = 400) -> str:
    """Run ``memgym launch --accelerate-config CONFIG train STAGE ARGS`` from the repo root in a
    subprocess (``OMP_NUM_THREADS=threads``, offline hub); asserts exit status 0 and that the
    printed command is ``accelerate launch --config_file launch/accelerate/CONFIG.yaml ...``.
    Returns stdout."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    repo = Path(__file__).resolve().parents[1]
    cmd = [sys.executable, "-m", "memgym.launch.cli", "launch", "--accelerate-config", config,
           "--main-process-port", str(free_port()), "train", stage, *args]
    env = dict(os.environ, OMP_NUM_THREADS=threads, HF_HUB_OFFLINE="1", **(env or {}))
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=repo, env=env, timeout=timeout)
    assert res.returncode == 0, (res.stdout[-3000:], res.stderr[-5000:])
    assert res.stdout.splitlines()[0].startswith(f"accelerate launch --config_file launch/accelerate/{config}.yaml")
    return res.stdout


def load_program_module(path, module_name: str | None = None):
    """Import a TRUSTED program file in-process (seed/reference, tests). Untrusted candidates
    must go through ``memgym.evolution.execution.sandbox.SandboxedProgram`` instead. The module is registered
    in ``sys.modules`` under ``module_name`` (default ``memgym_program_<stem>``) so that
    ``typing.get_type_hints`` can resolve its annotations. Raises FileNotFoundError naming
    the path."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"memory program not found: {path}")
    name = module_name or f"memgym_program_{path.stem}"
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        sys.modules.pop(name, None)
        raise
    return module


# ---- program runner: a 3-session conversation and a scripted task LLM

TASK = "openai:http://stub.invalid/v1#task"  # a registered ScriptedBackend, never contacted


def conversation() -> Conversation:
    """3 sessions x 2 turns, 4 QA (LongMemEval-style turn ids ``<session>:<k>``)."""
    texts = [("Caroline went to the LGBTQ support group", "Melanie painted a sunrise over the lake"),
             ("Caroline is researching adoption agencies", "Melanie took her kids camping in the mountains"),
             ("Caroline gave a talk at the school", "Melanie signed up for a pottery class")]
    sessions = tuple(Session(i + 1, f"s{i + 1}", datetime(2023, 5, 1 + 7 * i, 10), f"10:00 am on {1 + 7 * i} May, 2023",
                             (Turn(f"s{i + 1}:0", "Caroline", a), Turn(f"s{i + 1}:1", "Melanie", b)))
                     for i, (a, b) in enumerate(texts))
    qs = (QAItem("c/q0", "What did Caroline go to?", "LGBTQ support group", ("s1:0",), "4", Capability.FACTUAL),
          QAItem("c/q1", "Where did Melanie take her kids?", "camping in the mountains", ("s2:1",), "4",
                 Capability.FACTUAL),
          QAItem("c/q2", "When did Caroline give a talk?", "15 May 2023", ("s3:0",), "2", Capability.TEMPORAL),
          QAItem("c/q3", "What did Melanie paint and sign up for?", "sunrise, pottery", ("s1:1", "s3:1", "zz:9"), "1",
                 Capability.MULTI_SESSION))
    return Conversation("c", ("Caroline", "Melanie"), sessions, qs)


class Script:
    """Task LLM: extraction copies each transcript line into one unit; planning echoes the
    question; answering says "stub". Counts calls per stage by the system prompt."""

    def __init__(self):
        self.counts = {"extract": 0, "plan": 0, "answer": 0}

    def __call__(self, messages, params):
        system, user = messages[0]["content"], messages[-1]["content"]
        if "memory units" in user:
            self.counts["extract"] += 1
            lines = [ln.split(": ", 1)[1] for ln in user.splitlines() if ln.startswith("[s")]
            return json.dumps([{"content": t} for t in lines])
        if "Question:" in user and "Memory:" not in user:
            self.counts["plan"] += 1
            q = user.split("Question: ", 1)[1].split("\n", 1)[0]
            return json.dumps({"search_text": q, "time_hint": None} if "search_text" in user else {"question": q})
        self.counts["answer"] += 1
        return "stub"


# ---- synthetic QA: a deterministic expert


def fake_expert(messages, params) -> str:
    """A deterministic 'expert': reads the prompt's quota and turn ids and writes valid items
    (distinct questions made of the cited turn's own words)."""
    text = messages[-1]["content"]
    head, current = text.split("## Current session ", 1)
    sess = int(current.split(" ", 1)[0])
    turns = re.findall(r"^\[(D\d+:\d+)\] (\w+): (.*)$", current, flags=re.M)
    earlier = re.findall(r"^\[(D\d+:\d+)\] \(session", head, flags=re.M)
    kept = text.count("Do not repeat")  # retries ask for the rest; shift so questions differ
    items = []
    n = 0
    for count, kind in re.findall(r"^- (\d+) of kind \"([\w-]+)\"", text, flags=re.M):
        for _ in range(int(count)):
            tid, speaker, said = turns[(n + 3 * kept) % len(turns)]
            n += 1
            words = re.findall(r"[A-Za-z]{4,}", said) or ["something"]
            ev = [tid] + ([earlier[0]] if kind == "multi-session" else [])
            items.append({"question": f"In session {sess}, what did {speaker} mention about {' '.join(words[:6])}?",
                          "answer": words[-1], "evidence": ev, "kind": kind})
    return json.dumps({"qa": items})


# ---- session reward: hand-sized banks and QA

DOG = "2023-05-01: Alice adopted a dog named Biscuit | Details: from the shelter"
PILOT = "Bob - Job: works as an airline pilot | Details: flies to Lisbon"


class WordTokenizer:
    """Whitespace 'tokenizer' with the Hugging Face call shape (lengths are exact by hand)."""

    def __call__(self, texts, add_special_tokens=False):
        return {"input_ids": [t.split() for t in texts]}


def ops(*memories: str) -> str:
    """A non-core manager output that ADDs each memory."""
    return json.dumps({"operations": [{"action": "ADD", "memory": m} for m in memories]})


def qa(question: str, answer: str, evidence=("D1:1",)) -> QAItem:
    """A single-session QA item whose id is the question's first 10 characters."""
    return QAItem(id=question[:10], question=question, answer=answer, evidence=tuple(evidence), category="single-session")


def bank_with(session: int = 1, episodic=(), semantic=(), core: str = ""):
    """A bank with ``core`` appended and ``episodic`` / ``semantic`` entries added in ``session``."""
    from memgym.memory_bank.bank import MemoryBank

    bank = MemoryBank()
    if core:
        bank.apply_text("core", json.dumps({"operation": "APPEND", "content": core}), session)
    if episodic:
        bank.apply_text("episodic", ops(*episodic), session)
    if semantic:
        bank.apply_text("semantic", ops(*semantic), session)
    return bank


EMPTY = {"core": '{"operation": "NONE"}', "episodic": '{"operations": []}', "semantic": '{"operations": []}',
         "procedural": '{"operations": []}'}
"""Manager outputs that change nothing, per manager."""


def make_samples(bank, session: int, expert: dict[str, str], qa: list[QAItem],
                 managers=("core", "episodic", "semantic", "procedural")) -> list:
    """One :class:`memgym.rewards.samples.RewardSample` per manager of conversation ``c1``, session
    ``session``: the bank before it, the expert outputs (``EMPTY`` where not given), the QA."""
    from memgym.rewards.samples import RewardSample, sample_key

    outputs = {**EMPTY, **expert}
    return [RewardSample(sample_key("c1", session, m), "c1", session, m, [{"role": "user", "content": "x"}],
                         outputs, bank, list(qa)) for m in managers]


@contextmanager
def sandbox_fails(kind: str, match: str | None = None):
    """``pytest.raises(SandboxError, match=match)`` that also checks the failure's ``kind``
    (the sandbox's one error type tells its failures apart by ``kind``)."""
    import pytest

    from memgym.evolution.execution.sandbox import SandboxError

    with pytest.raises(SandboxError, match=match) as ei:
        yield ei
    assert ei.value.kind == kind, f"expected a {kind!r} failure, got {ei.value.kind!r}: {ei.value}"


#: A manager output cut off inside a JSON string (what a completion stopped on the token limit looks like).
CUT = '{"operations": [{"action": "ADD", "memory": "2023-05-08: Went to the'


class LengthMarked:
    """A Backend whose completions finish with ``finish_reason="length"`` when ``cut(messages)``."""

    def __init__(self, inner: ScriptedBackend, cut):
        self.inner, self.cut = inner, cut
        self.model_id = inner.model_id

    @property
    def calls(self):
        return self.inner.calls

    def generate(self, batch, params):
        out = self.inner.generate(batch, params)
        return [dataclasses.replace(c, finish_reason="length") if self.cut(m) else c for m, c in zip(batch, out)]
