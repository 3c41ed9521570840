"""Proposers: small interchangeable objects with one protocol
(:class:`memgym.evolution.search.protocols.Proposer`): ``params`` (offline, library of component
variants + constant mutations), ``coder`` (an LLM writing SEARCH/REPLACE edits), ``replay``
(a recorded coder run's answers, no server), ``scripted`` (fixed answers through the coder's
path, for tests)."""
from __future__ import annotations


def make_proposer(cfg, rt, splits: dict | None = None):
    """The proposer a recipe names (``cfg.proposer``): params | coder | replay | scripted. The
    coder's backend is loaded from ``cfg.coder_model`` with role ``coder`` (calls and tokens
    booked to it in the runtime); coder and replay state the run's facts
    (:func:`memgym.evolution.search.proposers.facts.facts_for` over ``splits``, the run's loaded splits,
    or the recipe's loaded here when None); replay reads ``cfg.replay_from`` and checks the run
    against it."""
    if cfg.proposer == "params":
        from memgym.evolution.search.proposers.params import ParamsProposer
        return ParamsProposer()
    if cfg.proposer == "scripted":
        from memgym.evolution.search.proposers.scripted import ScriptedProposer, load_script
        return ScriptedProposer(load_script(cfg.script))
    if cfg.proposer == "coder":
        from memgym.evolution.search.proposers.coder import CoderProposer, backend_chat
        from memgym.evolution.search.proposers.facts import facts_for
        backend = rt.backend(cfg.coder_model, role="coder")
        return CoderProposer(backend_chat(backend, cfg.coder_max_new_tokens, cfg.coder_temperature),
                             facts=facts_for(cfg, splits))
    if cfg.proposer == "replay":
        from memgym.evolution.search.proposers.facts import facts_for
        from memgym.evolution.search.proposers.replay import ReplayProposer, load_recorded_archive, load_recording
        return ReplayProposer(load_recording(cfg.replay_from, cfg.coder_max_new_tokens), facts_for(cfg, splits),
                              source=f"the recording in {cfg.replay_from}",
                              archive=load_recorded_archive(cfg.replay_from))
    raise ValueError(f"unknown proposer {cfg.proposer!r}; expected params, coder, replay or scripted")
