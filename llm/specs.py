"""Backend spec strings, one per role (policy, task, expert, judge, coder, annotator):

- ``hf:<path>``: a local transformers model or PEFT adapter dir; ``hf:smollm2`` / ``hf:default``
  is the embedded SmolLM2-135M-Instruct (:func:`memgym.llm.models.prepare_smollm2`).
- ``openai:<base_url>[,<base_url>...]#<model>``: an OpenAI-compatible server (replicas);
  API key ``$OPENAI_API_KEY`` or ``"EMPTY"``.
- ``vllm:<path>``: an in-process vLLM engine (GPU extra); aliases as for ``hf:``.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from memgym.llm.base import Backend, BackendSpecError
from memgym.llm.cache import CachedBackend, ResponseCache
from memgym.llm.errors import ConfigError

EXPECTED = ("expected one of 'hf:<model or adapter dir>' (or hf:smollm2 / hf:default), "
            "'openai:<http(s) base url>#<model>', 'vllm:<model dir>'")
DEFAULT_ALIASES = ("smollm2", "default")
#: The name that stands for the embedded SmolLM2-135M-Instruct (prepared once, no hub).
EMBEDDED_MODEL = "smollm2"
KINDS = ("hf", "openai", "vllm")


@dataclass(frozen=True)
class BackendSpec:
    """A parsed spec: ``kind`` in {"hf", "openai", "vllm"}; ``target`` the path (hf/vllm) or
    base URL (openai); ``model`` the served model name (openai only, else None)."""

    kind: str
    target: str
    model: str | None = None


def parse_spec(spec: str) -> BackendSpec:
    """Parse a spec string (loads nothing); :class:`BackendSpecError` when malformed."""
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


def check_spec(spec: str, field: str = "model", *, kind: str = "backend", words: tuple[str, ...] = ()) -> None:
    """:class:`ConfigError` unless ``spec`` is a backend spec (``kind="extractor"``: also
    ``expert:<x>[,...]`` or one of ``words``) whose local ``hf:``/``vllm:`` dir exists."""
    if not isinstance(spec, str) or not spec.strip():
        raise ConfigError(f"--{field}: expected a spec string, got {spec!r}")
    if kind == "extractor":
        if spec in words:
            return
        if spec.startswith("expert:"):
            if not all(x.strip() for x in spec[len("expert:"):].split(",")):
                raise ConfigError(f"--{field} {spec!r}: expert: needs a trajectory file or conversation id "
                                  "after the colon (expert:conv-30, expert:a.jsonl,b.jsonl)")
            return
    try:
        s = parse_spec(spec)
    except BackendSpecError as e:
        if kind != "extractor":
            more = ""
        elif words:
            more = f", one of {', '.join(words)}, or expert:<file or conv-NN>"
        else:
            more = " or expert:<file or conv-NN> (this command builds a memory bank; 'turns' and 'instruction' are program-runner modes of memgym program eval / evolve)"
        raise ConfigError(f"--{field}: {e}{more}") from None
    if s.kind in ("hf", "vllm") and s.target.lower() not in DEFAULT_ALIASES and not Path(s.target).expanduser().is_dir():
        close = closest_alias(s.target)
        hint = f"; did you mean {s.kind}:{close}?" if close else \
            f" (the embedded model is {s.kind}:smollm2; nothing is fetched from a model hub)"
        raise ConfigError(f"--{field} {spec!r}: {s.target} is not a local model directory{hint}")


def closest_alias(name: str, aliases: tuple[str, ...] = DEFAULT_ALIASES) -> str | None:
    """The alias ``name`` is a near-miss of (``difflib`` ratio >= 0.7, case-insensitive), else None."""
    import difflib

    close = difflib.get_close_matches(name.lower(), aliases, n=1, cutoff=0.7)
    return close[0] if close else None


def resolve_model_path(model: BackendSpec | str) -> Path | str:
    """Where to load a local model from.

    - a ``hf:``/``vllm:`` spec or :class:`BackendSpec` -> a Path (aliases: the prepared SmolLM2);
      :class:`BackendSpecError` for ``openai:`` or a missing dir.
    - a bare ``model_name_or_path`` -> str: ``smollm2`` the prepared dir, a local path its absolute
      form, else unchanged (a hub id from the local cache). ValueError for an empty name,
      FileNotFoundError for a missing path, :class:`ConfigError` for a near-miss of ``smollm2``.
    """
    if isinstance(model, BackendSpec) or (isinstance(model, str) and model.partition(":")[0].strip().lower() in KINDS):
        return _spec_model_dir(parse_spec(model) if isinstance(model, str) else model)
    if not model or not str(model).strip():
        raise ValueError("model_name_or_path is empty")
    if model == EMBEDDED_MODEL:
        from memgym.llm.models import prepare_smollm2

        return str(prepare_smollm2())
    p = Path(model).expanduser()
    if p.exists():
        return str(p.resolve())
    if model.startswith((".", "/", "~")):
        raise FileNotFoundError(f"model path {model} does not exist")
    if "/" not in model and closest_alias(model, (EMBEDDED_MODEL,)):
        raise ConfigError(f"--model_name_or_path {model!r} is not a local model dir; did you mean "
                          f"{EMBEDDED_MODEL!r} (the embedded model)? Nothing is fetched from a model hub")
    return model


def _spec_model_dir(s: BackendSpec) -> Path:
    if s.kind == "openai":
        raise BackendSpecError(f"spec openai:{s.target}#{s.model} names a server, not a local model dir")
    if s.target.lower() in DEFAULT_ALIASES:
        from memgym.llm.models import prepare_smollm2

        return prepare_smollm2()
    path = Path(s.target).expanduser()
    if not path.is_dir():
        close = closest_alias(s.target)
        hint = f"; did you mean {s.kind}:{close}?" if close else ""
        raise BackendSpecError(f"backend spec {s.kind}:{s.target}: {path.resolve()} is not a directory{hint}")
    return path


def load_backend(spec: str, *, cache: ResponseCache | None = None, **kw) -> Backend:
    """The backend ``spec`` names (``kw`` to its constructor; ``batch_size`` is dropped except for
    hf), in a :class:`CachedBackend` when ``cache`` is given. :class:`BackendSpecError` for a bad
    spec, a missing dir or vLLM missing."""

    s = parse_spec(spec)
    if s.kind != "hf":
        kw.pop("batch_size", None)
    backend: Backend
    if s.kind == "hf":
        from memgym.llm.hf_backend import HFBackend

        backend = HFBackend(resolve_model_path(s), **kw)
    elif s.kind == "vllm":
        from memgym.llm.vllm_backend import VLLMBackend, import_vllm

        import_vllm()  # fail with the install hint before preparing any model
        backend = VLLMBackend(resolve_model_path(s), **kw)
    else:
        from memgym.llm.openai_backend import OpenAIBackend

        kw.setdefault("api_key", os.environ.get("OPENAI_API_KEY") or "EMPTY")
        backend = OpenAIBackend(s.target, s.model, **kw)
    return CachedBackend(backend, cache) if cache is not None else backend
