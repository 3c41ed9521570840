"""Test helpers shared by every package's tests.

:class:`ScriptedBackend` implements :class:`llm.base.Backend` without a model: answers come
from a list (consumed in order) or a callable ``(messages, params) -> str``.
"""
from __future__ import annotations

from collections.abc import Callable

from llm.base import BackendRequestError, Completion, GenerationParams, Messages
from llm.messages import check_batch


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

    def generate(self, batch: list[Messages], params: GenerationParams) -> list[Completion]:
        check_batch(batch)
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


def trainable_state(model) -> dict:
    """{name: detached CPU copy} of every parameter with ``requires_grad`` (the LoRA weights
    for a PEFT model); tests compare it before and after training."""
    return {n: p.detach().cpu().clone() for n, p in model.named_parameters() if p.requires_grad}


def load_program_module(path, module_name: str | None = None):
    """Import a TRUSTED program file in-process (seed/reference, tests). Untrusted candidates
    must go through ``evolution.sandbox.SandboxedProgram`` instead. The module is registered
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
