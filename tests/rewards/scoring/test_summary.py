"""One evaluation path (issue 16): the same BEAM predictions give the same numbers through
``memgym eval``, ``memgym program eval`` and ``memgym score``; ``dataset`` (and the judge
protocol) reach the scorer of ``memgym evolve``; the three recipes share the data fields."""
from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from memgym.data_synth.errors import DataQuirkWarning
from memgym.llm.embeddings import HashEmbedder
from memgym.llm.runtime import Runtime
from tests.helpers import ScriptedBackend

EX, ANS, JUDGE = (f"openai:http://stub.invalid/v1#{r}" for r in ("extractor", "answer", "judge"))
RECIPES = Path(__file__).resolve().parents[3] / "launch" / "recipes"


def _prediction(question: str) -> str:
    """A fixed answer per question (two lines: the judge must see both)."""
    return f"My answer to: {question[:30]}\nSecond line of the answer."


def _answer(messages, params):
    user = messages[-1]["content"]
    q = user.split("Question: ")[-1].split("\n")[0]
    return _prediction(q)


def _judge(messages, params):
    """Deterministic: full credit for rubric items that say 'state', half credit (int() -> 0
    officially) for the others."""
    return '{"score": 1.0}' if "should state" in messages[0]["content"] else '{"score": 0.5}'


def _extractor(messages, params):
    if "Your part is CORE" in messages[0]["content"]:
        return '{"operation": "NONE"}'
    return '{"operations": [{"action": "ADD", "memory": "a note"}]}'


def _runtime():
    rt = Runtime(embedder=HashEmbedder(dim=64))
    for spec, fn in ((EX, _extractor), (ANS, _answer), (JUDGE, _judge)):
        rt.register(spec, ScriptedBackend(fn))
    return rt


@pytest.mark.parametrize("protocol", ["official", "corrected"])
def test_same_beam_predictions_same_numbers_through_eval_program_eval_and_score(tmp_path, protocol):
    from memgym.data_synth.datasets import load_conversations
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig, run_program_eval
    from memgym.evolution.execution.stage_cache import StageCache
    from memgym.memory_bank.programs import reference_program_path
    from memgym.evolution.evaluation.eval_job import EvalConfig, run_eval
    from memgym.rewards.scoring.scorers import make_scorer
    from memgym.rewards.scoring.predictions import score_predictions

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        ev = run_eval(EvalConfig(dataset="beam", conversations=["100K-3"], n_sessions=1, extractor=EX,
                                 task_model=ANS, scorer="llm", judge_model=JUDGE, judge_protocol=protocol,
                                 extractor_max_new_tokens=200, extractor_context_tokens=4000,
                                 out=str(tmp_path / "eval"), progress=False, cache="none", stage_cache="none"),
                     _runtime())
        pe = run_program_eval(ProgramEvalConfig(
            program=str(reference_program_path()), dataset="beam", conversations=["100K-3"], n_sessions=1,
            extractor="turns", task_model=ANS, plan_mode="question", scorer="llm", judge_model=JUDGE,
            judge_protocol=protocol, validate=False, diagnostics=False, progress=False, out=str(tmp_path / "pe")),
            _runtime(), StageCache())
        convs = load_conversations("beam", None, ids=["100K-3"])
    preds = {r["id"]: {"prediction": r["prediction"], "context": None, "line": i + 1}
             for i, r in enumerate(ev["predictions"])}
    assert len(preds) == 8 and all("\nSecond line" in p["prediction"] for p in preds.values())
    assert [t["prediction"] for t in pe.tasks] == [r["prediction"] for r in ev["predictions"]]
    sc = score_predictions("beam", convs, preds, make_scorer("llm", ScriptedBackend(_judge), dataset="beam",
                                                             judge_protocol=protocol), judge_protocol=protocol)
    pe_summary = {**pe.summary, "by_category": pe.by_category, "by_capability": pe.by_capability}
    for key in ("overall", "by_ability", "by_category", "by_capability", "judged"):
        assert ev[key] == pe_summary[key] == sc[key], key
    assert ev["overall"] == pe.overall == sc["overall"]
    assert len(sc["missing"]) == 12 and ev["missing"] == pe_summary["missing"] == []
    # by hand: information_extraction 1 -> 1 item 'state' (1.0); 2 -> 2 items 'state' (1.0);
    # instruction/preference/contradiction items do not say 'state': 0 (official) or 0.5 (corrected)
    half = 0.0 if protocol == "official" else 0.5
    assert ev["by_ability"]["information_extraction"] == 1.0
    assert ev["by_ability"]["preference_following"] == half
    assert ev["judge_protocol"] == pe.judge_protocol == sc["judge_protocol"] == protocol
    assert all(r["judge"] and r["judge"][0]["reply"] for r in sc["rows"] if not r["missing"])
    assert all(t["judge"] for t in pe.tasks) and all(r["judge"] for r in ev["predictions"])


def test_dataset_and_protocol_reach_the_scorer_in_evolve():
    from trl import TrlParser

    from memgym.evolution.execution.runner import ProgramRunner
    from memgym.evolution.search.config import EvolveConfig
    from memgym.rewards.scoring.official import LongMemEvalScorer

    cfg = TrlParser(dataclass_types=[EvolveConfig]).parse_args_and_config(
        args=["--config", str(RECIPES / "evolve_longmemeval_coder.yaml")])[0]
    settings = cfg  # the recipe is the runner settings
    assert (settings.dataset, settings.scorer, settings.judge_protocol) == ("longmemeval", "llm", "official")
    assert settings.answer_max_new_tokens == 64  # the recipe's; unset it is the dataset's (128 for longmemeval)
    rt = Runtime(embedder=HashEmbedder(dim=16))
    rt.register(cfg.judge_model, ScriptedBackend(lambda m, p: "yes"))
    scorer = ProgramRunner(rt, settings).scorer
    assert isinstance(scorer, LongMemEvalScorer)  # not the LoCoMo CORRECT/WRONG judge
    # every field the runner settings share with the recipe is copied, none by hand
    import dataclasses
    from memgym.evolution.execution.runner import RunnerSettings
    shared = {f.name for f in dataclasses.fields(RunnerSettings)} & {f.name for f in dataclasses.fields(EvolveConfig)}
    assert {"dataset", "judge_protocol", "scorer", "judge_model", "extractor"} <= shared
    assert all(getattr(settings, k) == getattr(cfg, k) for k in shared - {"answer_max_new_tokens", "diagnostics"})


def test_recipes_share_the_data_fields():
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig
    from memgym.evolution.search.config import EvolveConfig
    from memgym.evolution.evaluation.eval_job import EvalConfig
    from memgym.rewards.scoring.selection import BenchmarkFields, QuestionSelection

    assert issubclass(EvalConfig, QuestionSelection) and issubclass(ProgramEvalConfig, QuestionSelection)
    assert issubclass(EvolveConfig, BenchmarkFields)
    from memgym.llm.errors import ConfigError
    with pytest.raises(ConfigError, match="--judge_protocol: judge_protocol 'corrected' exists for beam only"):
        EvalConfig(judge_protocol="corrected")


def test_stage_cache_key_includes_the_protocol(tmp_path):
    """One stage cache, official then corrected: the second run re-scores (its judge answers
    differ) instead of reusing the first run's scores."""
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig, run_program_eval
    from memgym.evolution.execution.stage_cache import StageCache
    from memgym.memory_bank.programs import reference_program_path

    cache = StageCache()
    got = {}
    for protocol in ("official", "corrected", "official"):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DataQuirkWarning)
            ev = run_program_eval(ProgramEvalConfig(
                program=str(reference_program_path()), dataset="beam", conversations=["100K-3"], n_sessions=1,
                extractor="turns", task_model=ANS, plan_mode="question", scorer="llm", judge_model=JUDGE,
                judge_protocol=protocol, validate=False, diagnostics=False, progress=False,
                out=str(tmp_path / protocol)), _runtime(), cache)
        got.setdefault(protocol, []).append((ev.summary["by_ability"]["preference_following"], ev.stage_items["score"]))
    assert got["official"][0] == (0.0, {"run": 8, "reused": 0})
    assert got["corrected"][0] == (0.5, {"run": 8, "reused": 0})
    assert got["official"][1] == (0.0, {"run": 0, "reused": 8})
