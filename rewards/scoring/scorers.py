"""The scorer factory: a scorer by its CLI name (``--scorer grounded-recall|f1|answer-recall|rubric-recall|llm``).
It sits above both the scorer types (:mod:`memgym.rewards.scoring.judge`) and the official judges
(:mod:`memgym.rewards.scoring.official`), which build on those types."""
from __future__ import annotations

from memgym.llm.base import Backend, GenerationParams
from memgym.rewards.scoring.grounded import GroundedRecallScorer
from memgym.rewards.scoring.judge import F1Scorer, LLMJudgeScorer, RecallScorer, Scorer
from memgym.rewards.scoring.official import BeamScorer, LoCoMoJudgeScorer, LongMemEvalScorer, RubricRecallScorer
from memgym.rewards.scoring.judge_protocols import check_protocol

SCORER_NAMES: tuple[str, ...] = ("grounded-recall", "f1", "answer-recall", "rubric-recall", "llm")
#: What each word-coverage proxy cannot see, printed beside its numbers.
BLIND_SPOTS: dict[str, str] = {
    "answer-recall": "word coverage: credits the gold answer's words anywhere in the text, so a query-independent "
                     "word list outscores retrieval; use grounded-recall",
    "rubric-recall": "word coverage: credits rubric words anywhere in the text, so a query-independent word list "
                     "outscores retrieval; use grounded-recall",
}


def make_scorer(name: str, judge_backend: Backend | None = None,
                judge_params: GenerationParams | None = None, judge_constrained: bool = False,
                dataset: str | None = None, judge_protocol: str = "official") -> Scorer:
    """A scorer by CLI name: grounded-recall (the default offline scorer), f1, answer-recall,
    rubric-recall (word-coverage proxies, :data:`BLIND_SPOTS`), or llm (the official judge of
    ``dataset`` under ``judge_protocol``; memgym's :class:`LLMJudgeScorer` without a dataset,
    the only one ``judge_params`` / ``judge_constrained`` apply to). Raises ValueError for an
    unknown name or protocol, a missing backend, or judge options with an official protocol.
    """
    check_protocol(dataset, judge_protocol)
    if name == "grounded-recall":
        return GroundedRecallScorer()
    if name == "f1":
        return F1Scorer()
    if name == "answer-recall":
        return RecallScorer()
    if name == "rubric-recall":
        return RubricRecallScorer()
    if name == "llm":
        if judge_backend is None:
            raise ValueError('scorer "llm" needs a judge backend (judge_backend=None given)')
        if dataset is not None:
            if judge_constrained or judge_params is not None:
                raise ValueError(f"the {dataset} judge follows the official protocol's request settings: "
                                 "judge_constrained / judge_params do not apply (LoCoMo's already asks for a JSON "
                                 "object)")
            cls = {"longmemeval": LongMemEvalScorer, "beam": BeamScorer, "locomo": LoCoMoJudgeScorer}.get(dataset)
            if cls is None:
                raise ValueError(f"no official judge for dataset {dataset!r}")
            return cls(judge_backend, judge_protocol)
        return LLMJudgeScorer(judge_backend, judge_params, constrained=judge_constrained)
    raise ValueError(f"unknown scorer {name!r}; expected one of {', '.join(SCORER_NAMES)}")
