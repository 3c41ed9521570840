"""Extractor specs, the one parser of what builds a memory bank: ``instruction`` and ``turns``
(program runner only), ``expert:<file or conv-NN>[,...]`` (replay) or a backend spec
(:mod:`memgym.llm.specs`) of a trained extractor."""
from __future__ import annotations

from pathlib import Path

from memgym.data_synth.expert import ExpertExtractor
from memgym.llm.errors import ConfigError

EXPERT_PREFIX = "expert:"


class ExtractorCoverageError(ConfigError):
    """An ``expert:`` replay has no trajectory for sessions it is asked to build (e.g. another
    conversation's file); the message names the file, the conversation and what the file holds."""


def check_coverage(extractor, conversations) -> None:
    """Raise :class:`ExtractorCoverageError` when ``extractor`` (an :class:`ExpertExtractor`;
    anything else passes) lacks a trajectory line for a session of ``conversations``."""
    if not isinstance(extractor, ExpertExtractor):
        return
    for conv in conversations:
        missing = extractor.missing_sessions(conv)
        if not missing:
            continue
        held = ", ".join(extractor.conversation_ids) or "nothing"
        if conv.id not in extractor.conversation_ids:
            raise ExtractorCoverageError(
                f"{extractor.name} holds trajectories of {held}, none of {conv.id}: pass expert:{conv.id} (if that "
                f"file exists) or evaluate {held}")
        raise ExtractorCoverageError(f"{extractor.name} has no trajectory line for sessions {missing} of {conv.id} "
                                     f"({len(conv.sessions) - len(missing)} of {len(conv.sessions)} covered; lower "
                                     "--n_sessions)")


def extractor_kind(spec: str) -> str:
    """``instruction`` | ``turns`` | ``expert`` | ``extractor`` (a trained model) for a spec.
    Raises ValueError for an empty spec or an ``expert:`` spec without files."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"extraction spec must be a non-empty str, got {spec!r}")
    if spec in ("instruction", "turns"):
        return spec
    if spec.startswith(EXPERT_PREFIX):
        if not [x for x in spec[len(EXPERT_PREFIX):].split(",") if x.strip()]:
            raise ValueError(f"extraction spec {spec!r} names no trajectory file")
        return "expert"
    return "extractor"


def resolve_expert_path(name: str) -> Path:
    """A trajectory path as given, or a bare name (``conv-30``) looked up in the shipped
    expert dir (``$MEMGYM_DATA/expert/<name>.jsonl``). Raises FileNotFoundError naming both."""
    p = Path(name)
    if p.is_file():
        return p
    from memgym.data_synth.paths import expert_dir

    alt = expert_dir() / (name if name.endswith(".jsonl") else f"{name}.jsonl")
    if alt.is_file():
        return alt
    raise FileNotFoundError(f"expert trajectories not found: {p} (nor {alt})")


def expert_paths(spec: str) -> list[Path]:
    """The trajectory files of an ``expert:a,b`` spec, each resolved by
    :func:`resolve_expert_path`. Raises ValueError for a spec of another kind."""
    if extractor_kind(spec) != "expert":
        raise ValueError(f"{spec!r} is not an expert:<file>[,...] spec")
    return [resolve_expert_path(x.strip()) for x in spec[len(EXPERT_PREFIX):].split(",") if x.strip()]


def make_extractor(spec: str, rt, max_new_tokens: int = 512, *, constrained: bool = False,
                   max_chars: int | None = None, max_items: int | None = None, context_tokens: int | None = None,
                   conversations=None, segment_tokens: int | None = None):
    """``expert:...`` -> :class:`ExpertExtractor`; a backend spec ->
        :class:`memgym.memory_bank.construct.ModelExtractor` on ``rt.backend(spec, role="extractor")`` (the
        other arguments are its own; ignored for replays). An expert replay lacking a session of
        ``conversations`` raises :class:`ExtractorCoverageError` before any work. ValueError for
        ``instruction`` or an empty spec, FileNotFoundError, BackendSpecError."""
    kind = extractor_kind(spec)
    if kind == "expert":
        from memgym.data_synth.paths import record_read

        paths = expert_paths(spec)
        for p in paths:  # the run card's fingerprint of this replay
            record_read(p, "trajectory file", spec=spec)
        ext = ExpertExtractor(*paths)
        check_coverage(ext, conversations or [])
        return ext
    if kind in ("instruction", "turns"):
        raise ValueError(f"extraction {spec!r} runs inside the program runner; it builds no bank")
    from memgym.llm.base import GenerationParams
    from memgym.memory_bank.construct import ModelExtractor

    return ModelExtractor(rt.backend(spec, role="extractor"), GenerationParams(max_new_tokens=max_new_tokens),
                          name=spec, constrained=constrained, max_chars=max_chars, max_items=max_items,
                          context_tokens=context_tokens, segment_tokens=segment_tokens)
