"""What scores a program in this run, stated in the coder's request (:func:`run_facts`).

Source: docs/design.md § "Capability-driven evolution" (proposers see the diagnostics, cases and
lineage) and § "Diagnostics"; PrisMem (arXiv 2610.06361) appendix on
the proposer prompt. The program contract (``INTERFACE``) is the same in every run; these
facts are the run's: the context budget every retrieved text is cut to (tokens, tokenizer and
about how many characters of this dataset's turns that is), the scorer and what it reads, the
extractor that produced the units, whether planning and answering call a model, which model
``toolkit.llm`` is and its call budget, the embedder, what each diagnostics column means, the
acceptance rule of each stage and the size of every split the program is scored on (so a memory
is built for the largest conversation it will meet, e.g. BEAM-1M's test chats).

``run_facts(cfg, train_convs, splits)`` is a pure function of the recipe and the loaded data (the
approximate characters: the train conversations and the context tokenizer; the sizes: the splits),
so a replayed run renders the same request. Size: about 550 words.
"""
from __future__ import annotations

SCORERS = {
    "grounded-recall": "grounded-recall: per question, half the credit is the share of the gold evidence turns that the "
                       "(cut) retrieved text holds verbatim (a turn counts where runs of 4 consecutive normalised "
                       "words of it occur in the text; 32 such words make a turn count whole), half the share of the "
                       "reference answer's words ({what}) found inside runs of 4 words copied from the conversation "
                       "(or the evidence share, when higher). Words outside real conversation text earn nothing: "
                       "keyword lists, summaries in other words, or shuffled text score 0. Questions without gold "
                       "evidence are not scored. No model call, no answer is generated, so ANSWER_INSTRUCTION is "
                       "not used and only retrieve()'s text counts",
    "answer-recall": "answer-recall: the share of the reference answer's distinct stemmed, normalised word tokens "
                     "that occur in the (cut) retrieved text; no model call, no answer is generated, so "
                     "ANSWER_INSTRUCTION is not used and only retrieve()'s text counts",
    "rubric-recall": "rubric-recall (BEAM offline proxy): the share of the question's rubric items recalled by the "
                     "(cut) retrieved text; no model call, no answer is generated, so ANSWER_INSTRUCTION is not used",
    "f1": "token F1 between the task model's answer (written from the cut retrieved text with ANSWER_INSTRUCTION) "
          "and the reference answer",
    "llm": "the dataset's official LLM judge ({judge}) grading the task model's answer (written from the cut "
           "retrieved text with ANSWER_INSTRUCTION) against the reference answer",
}

EXTRACTORS = {
    "turns": "extractor `turns` (no model): every dialogue turn is one MemoryUnit, content \"speaker: text\" (an image "
             "caption appended as [image: ...]), date = its session's date (YYYY-MM-DD); EXTRACTION_INSTRUCTION is "
             "not used, so changing it or adding MemoryUnit fields changes nothing",
    "instruction": "extractor `instruction`: the task model ({task}) reads each session with EXTRACTION_INSTRUCTION "
                   "and writes the MemoryUnit list (JSON)",
}

DIAGNOSTICS = (
    "Diagnostics columns (train split, per capability; docs/design.md § Diagnostics): n = tasks; score = the scorer's "
    "mean; d_ext, d_idx, d_ret are cosine maxima in [0, 1] (embedder {embedder}), averaged over the tasks' evidence "
    "turns e: d_ext = max cos(e, units extracted from e's session), d_idx = max cos(e, a line retrieve() returns "
    "when e itself is the query), d_ret = max cos(e, a line retrieve() returns for the real question) -- they are "
    "NOT rates; unit chars = mean characters per unit; retrieved chars = mean characters of retrieve()'s output "
    "{after}."
)

ACCEPTANCE = {
    "cold": "cold start: the child becomes the new base when its valid overall score beats the base's strictly, "
            "and the specialist of each capability whose valid score it beats strictly",
    "refine": "capability refinement: the child is kept when it beats, strictly on the valid split, the specialist "
              "of some capability on that capability (it then becomes that capability's specialist); otherwise "
              "it is rejected, even if the overall score rose",
    "integrate": "integration: the merged program is accepted when its valid overall score beats the program it "
                 "is merged onto strictly and no capability's valid score drops by more than delta = {delta}",
    "holistic": "holistic: the child becomes the new base when its valid overall score beats the base's strictly",
}


def approx_chars(tokens: int, tokenizer: str, convs) -> int | None:
    """Characters of the first ``tokens`` tokens of the train turns rendered as
    ``[YYYY-MM-DD] speaker: text`` lines (the first conversation whose text is longer than the
    budget): the context budget in characters of this data. None when no conversation is."""
    from memgym.rewards.scoring.context_budget import ContextBudget

    budget = ContextBudget(tokens, tokenizer)
    for conv in convs:
        lines = []
        for s in conv.sessions:
            date = s.date.date().isoformat() if s.date else ""
            lines += [f"[{date}] {t.speaker}: {t.text}" for t in s.turns if (t.text or "").strip()]
        text = "\n".join(lines)
        cut = budget.cut(text)
        if len(cut) < len(text):
            return len(cut)
    return None


def capability_map_line(dataset: str) -> str:
    """How ``dataset``'s own question categories map to the capabilities F/T/P/M/A
    (:mod:`memgym.data_synth.capabilities`), e.g. ``LoCoMo 4 single-hop -> F, ...``."""
    from memgym.data_synth import capabilities as caps

    if dataset == "locomo":
        pairs = [(f"{k} {caps.LOCOMO_CATEGORY_NAMES[k]}", v) for k, v in caps.LOCOMO_MAP.items()]
    elif dataset == "longmemeval":
        pairs = [*caps.LONGMEMEVAL_MAP.items(), ("any id ending in _abs (abstention)", caps.A)]
    else:
        pairs = list(caps.BEAM_MAP.items())
    return f"{dataset}'s categories map to " + ", ".join(f"{k} -> {v.value}" for k, v in pairs)


def _tokens(n: int) -> str:
    return f"~{n / 1e6:.1f}M" if n >= 1_000_000 else f"~{n / 1e3:,.0f}K" if n >= 1000 else f"~{n}"


def split_sizes(splits: dict) -> str:
    """What each split holds as loaded, one line per split (conversations, sessions, turns,
    approximate tokens in all and in its largest conversation; tokens ~ characters of
    ``speaker: text`` / 4)."""
    parts = []
    for split, what in (("train", "diagnostics and cases"), ("valid", "acceptance"),
                        ("test", "the frozen program, run once")):
        convs = splits.get(split) or []
        if not convs:
            continue
        turns = [sum(len(s.turns) for s in c.sessions) for c in convs]
        chars = [sum(len(t.speaker) + 2 + len(t.text or "") + len(t.image_caption or "") for s in c.sessions
                     for t in s.turns) for c in convs]
        parts.append(f"  - {split} ({what}): {len(convs):,} conversations, {sum(len(c.sessions) for c in convs):,} "
                     f"sessions, {sum(turns):,} turns, {_tokens(sum(chars) // 4)} tokens (largest conversation: "
                     f"{max(turns):,} turns, {_tokens(max(chars) // 4)} tokens)")
    return "\n".join(["- Data sizes (as loaded for this run; one Memory holds one whole conversation, so index() "
                      "must scale to the largest, test included; tokens ~ characters / 4):", *parts])


def run_facts(cfg, train_convs=(), splits: dict | None = None) -> str:
    """The "# What scores your program in this run" section of a coder request (module doc).
    ``cfg``: an :class:`memgym.evolution.search.config.EvolveConfig`; ``train_convs``: its train
    conversations (for the approximate characters; may be empty); ``splits``: ``{"train"|"valid"|
    "test": [Conversation]}`` as the run loaded them (their sizes; None: not stated)."""
    lines = ["# What scores your program in this run"]
    if cfg.context_tokens:
        chars = approx_chars(cfg.context_tokens, cfg.context_tokenizer, train_convs)
        approx = f", about {chars:,} characters of this dataset's turns" if chars else ""
        lines.append(f"- Context budget: every text retrieve() returns is cut to its first {cfg.context_tokens:,} "
                     f"tokens of the `{cfg.context_tokenizer}` tokenizer{approx}, before the answer and score stages; "
                     "text after the cut is never read. OUT_CHAR_BUDGET (16,000 characters) is only the contract's "
                     "hard cap: put the most useful lines first.")
    else:
        lines.append("- Context budget: none beyond OUT_CHAR_BUDGET (16,000 characters); everything retrieve() "
                     "returns is read.")
    judge = cfg.judge_model or "-"
    what = ("BEAM: each rubric item counts when all its content words are there" if cfg.dataset == "beam"
            else "distinct stemmed, normalised words")
    lines.append("- Scorer: " + SCORERS[cfg.scorer].format(judge=judge, what=what) + ".")
    lines.append("- Capabilities: " + capability_map_line(cfg.dataset) + ".")
    kind = cfg.extractor.split(":", 1)[0]
    ext = EXTRACTORS.get(kind, f"extractor `{cfg.extractor}` (a trained extractor or a replayed trajectory): its "
                               "bank entries become the units; EXTRACTION_INSTRUCTION is not used")
    lines.append("- Units: " + ext.format(task=cfg.task_model) + ".")
    if cfg.plan_mode == "question":
        lines.append("- Planning: no model call (plan_mode question): the Query is built from the question text "
                     "alone (it fills the first text field, e.g. `question`); every other Query field keeps its "
                     "default, so fields you add to Query stay empty and PLANNING_INSTRUCTION is not used.")
    else:
        lines.append(f"- Planning: the task model ({cfg.task_model}) fills the Query as JSON from the question with "
                     f"PLANNING_INSTRUCTION (at most {cfg.plan_max_new_tokens} tokens); an unparsable plan falls "
                     "back to the question text.")
    answers = cfg.scorer in ("f1", "llm")
    lines.append(f"- Answering: the task model ({cfg.task_model}) answers from the cut retrieved text with "
                 f"ANSWER_INSTRUCTION (at most {cfg.answer_tokens} tokens)." if answers else
                 "- Answering: no model call (the scorer reads the retrieved text).")
    calls = cfg.program_llm_calls
    lines.append(f"- toolkit.llm is the task model `{cfg.task_model}` with a budget of {calls} calls per "
                 "conversation" + (": every call raises BudgetExceededError, so do not call it." if calls == 0 else
                                   "; a call beyond it raises BudgetExceededError.")
                 + f" toolkit.embed is the embedder `{cfg.embedder}`.")
    after = f"after the cut to {cfg.context_tokens:,} tokens" if cfg.context_tokens else "(no cut)"
    lines.append("- " + DIAGNOSTICS.format(embedder=cfg.embedder, after=after))
    stages = ["holistic"] if cfg.ablation == "holistic" else ["cold", "refine"] + (
        ["integrate"] if cfg.rounds_integrate and cfg.ablation != "no_integration" else [])
    lines.append("- Acceptance: " + "; ".join(ACCEPTANCE[s].format(delta=cfg.delta) for s in stages) + ".")
    if splits:
        lines.append(split_sizes(splits))
    return "\n".join(lines)


def facts_for(cfg, splits: dict | None = None) -> str:
    """:func:`run_facts` of a recipe over its splits as the run loaded them (``splits``; loaded
    here when None)."""
    if splits is None:
        splits = {s: cfg.load_split(s) for s in ("train", "valid", "test")}
    return run_facts(cfg, splits["train"] if cfg.context_tokens else [], splits)
