"""Backend spec strings, one per role (policy, task, expert, judge, coder, annotator).

Source: ``DESIGN.md`` § "LLM backends". Forms:

- ``hf:<path>``: a local transformers model dir or PEFT adapter dir (:class:`HFBackend`);
  ``hf:smollm2`` and ``hf:default`` mean the embedded SmolLM2-135M-Instruct
  (:func:`llm.models.prepare_smollm2`).
- ``openai:<base_url>#<model>``: an OpenAI-compatible server, e.g.
  ``openai:http://127.0.0.1:8000/v1#Qwen3-32B`` (:class:`OpenAIBackend`); the API key comes
  from ``$OPENAI_API_KEY`` or is ``"EMPTY"``. Several comma-separated base URLs
  (``openai:http://h1:8000/v1,http://h2:8000/v1#Qwen3-32B``) are data-parallel replicas of one
  model; requests are spread over them.
- ``vllm:<path>``: an in-process vLLM engine (:class:`VLLMBackend`, GPU extra);
  ``vllm:smollm2`` / ``vllm:default`` as for ``hf:``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from llm.base import Backend, BackendSpecError
from llm.cache import CachedBackend, ResponseCache

EXPECTED = ("expected one of 'hf:<model or adapter dir>' (or hf:smollm2 / hf:default), "
            "'openai:<http(s) base url>#<model>', 'vllm:<model dir>'")
DEFAULT_ALIASES = ("smollm2", "default")


@dataclass(frozen=True)
class BackendSpec:
    """A parsed spec: ``kind`` in {"hf", "openai", "vllm"}; ``target`` the path (hf/vllm) or
    base URL (openai); ``model`` the served model name (openai only, else None)."""

    kind: str
    target: str
    model: str | None = None


def parse_spec(spec: str) -> BackendSpec:
    """Parse (without loading anything) a spec string. Raises :class:`BackendSpecError`
    naming the spec and the expected forms when it is malformed."""
    if not isinstance(spec, str) or ":" not in spec:
        raise BackendSpecError(f"backend spec {spec!r} is malformed: {EXPECTED}")
    kind, _, rest = spec.partition(":")
    kind = kind.strip().lower()
    rest = rest.strip()
    if kind in ("hf", "vllm"):
        if not rest:
            raise BackendSpecError(f"backend spec {spec!r} has an empty path: {EXPECTED}")
        return BackendSpec(kind, rest)
    if kind == "openai":
        url, sep, model = rest.rpartition("#")
        if not sep or not url or not model.strip():
            raise BackendSpecError(f"backend spec {spec!r} must name a model after '#': {EXPECTED}")
        for u in url.split(","):  # several base urls = data-parallel replicas of one model
            u = u.strip()
            if not (u.startswith("http://") or u.startswith("https://")) or len(u.split("://", 1)[1]) == 0:
                raise BackendSpecError(f"backend spec {spec!r} needs http(s):// base url(s): {EXPECTED}")
        return BackendSpec(kind, url, model.strip())
    raise BackendSpecError(f"backend spec {spec!r} has unknown kind {kind!r}: {EXPECTED}")


def resolve_model_path(spec: BackendSpec | str) -> Path:
    """The local dir named by an ``hf:``/``vllm:`` spec (preparing SmolLM2 for the aliases).
    Raises :class:`BackendSpecError` for an ``openai:`` spec or a dir that does not exist."""
    s = parse_spec(spec) if isinstance(spec, str) else spec
    if s.kind == "openai":
        raise BackendSpecError(f"spec openai:{s.target}#{s.model} names a server, not a local model dir")
    if s.target.lower() in DEFAULT_ALIASES:
        from llm.models import prepare_smollm2

        return prepare_smollm2()
    path = Path(s.target).expanduser()
    if not path.is_dir():
        import difflib

        close = difflib.get_close_matches(s.target.lower(), DEFAULT_ALIASES, n=1, cutoff=0.7)
        hint = f"; did you mean {s.kind}:{close[0]}?" if close else ""
        raise BackendSpecError(f"backend spec {s.kind}:{s.target}: {path.resolve()} is not a directory{hint}")
    return path


def load_backend(spec: str, *, cache: ResponseCache | None = None, **kw) -> Backend:
    """Build the backend a spec names; wrap it in :class:`CachedBackend` when ``cache`` is given.

    ``kw`` goes to the backend's constructor (e.g. ``batch_size``/``device`` for hf,
    ``max_concurrency``/``timeout_s`` for openai, engine options for vllm). ``batch_size`` is
    accepted for every kind so that callers can pass one setting to any spec: it is the
    prompts per forward pass for hf and is dropped for openai (parallelism there is
    ``max_concurrency``) and vllm (the engine schedules its own batches).
    Raises :class:`BackendSpecError` for a malformed spec, a missing dir, or vLLM missing.
    """
    s = parse_spec(spec)
    if s.kind != "hf":
        kw.pop("batch_size", None)
    backend: Backend
    if s.kind == "hf":
        from llm.hf_backend import HFBackend

        backend = HFBackend(resolve_model_path(s), **kw)
    elif s.kind == "vllm":
        from llm.vllm_backend import VLLMBackend, import_vllm

        import_vllm()  # fail with the install hint before preparing any model
        backend = VLLMBackend(resolve_model_path(s), **kw)
    else:
        from llm.openai_backend import OpenAIBackend

        kw.setdefault("api_key", os.environ.get("OPENAI_API_KEY") or "EMPTY")
        backend = OpenAIBackend(s.target, s.model, **kw)
    return CachedBackend(backend, cache) if cache is not None else backend
