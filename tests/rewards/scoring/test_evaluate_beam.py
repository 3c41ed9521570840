"""``memgym eval`` on BEAM with scripted backends: the first session of 100K chat 3 is built in
segments (reported), ``scorer: llm`` picks BEAM's rubric judge, and the report carries BEAM's
headline (per ability, overall labelled as ours) and the judge's call accounting."""
from __future__ import annotations

import json
import warnings

from memgym.data_synth.errors import DataQuirkWarning
from memgym.llm.embeddings import HashEmbedder
from memgym.llm.runtime import Runtime
from memgym.evolution.evaluation.eval_job import EvalConfig, run_eval
from tests.helpers import ScriptedBackend

EX, ANS, JUDGE = (f"openai:http://stub.invalid/v1#{r}" for r in ("extractor", "answer", "judge"))


def _extractor(messages, params):
    if "Your part is CORE" in messages[0]["content"]:
        return '{"operation": "NONE"}'
    return '{"operations": [{"action": "ADD", "memory": "a note"}]}'


def test_eval_beam_segmented_with_the_official_judge(tmp_path):
    rt = Runtime(embedder=HashEmbedder(dim=64))
    judge = ScriptedBackend(lambda m, p: '{"score": 0.5, "reason": "partly"}')
    rt.register(EX, ScriptedBackend(_extractor))
    rt.register(ANS, ScriptedBackend(lambda m, p: "an answer"))
    rt.register(JUDGE, judge)
    cfg = EvalConfig(dataset="beam", conversations=["100K-3"], n_sessions=1, extractor=EX, task_model=ANS,
                     scorer="llm", judge_model=JUDGE, extractor_max_new_tokens=200, extractor_context_tokens=4000,
                     out=str(tmp_path), progress=False, cache="none", stage_cache="none",
                     judge_protocol="corrected")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        rep = run_eval(cfg, rt)
    assert rep["segments"] == {"100K-3": {"sessions": 1, "segments": 22, "split_sessions": {"1": 22}}}
    # the 8 questions whose evidence lies in session 1 (restrict drops the evidence-less abstention ones)
    assert rep["n"] == 8 and {r["score"] for r in rep["predictions"]} == {0.5}
    # corrected: the question is filled in (official leaves '<question>'), 0.5 kept (official: int() -> 0)
    assert all(r["question"] in m[0]["content"] for r in rep["predictions"][:1] for m, _ in judge.seen[:1])
    # one judge call per rubric item: contradiction 4 + extraction 1+2 + instruction 2+1 + update 1 + preference 2
    # + temporal 2
    assert rep["judge_calls"]["prompts"] == len(judge.seen) == 15 and rep["judge_calls"]["unreadable"] == 0
    assert rep["overall"] == 0.5 and len(rep["by_ability"]) == 6 and "mean of the BEAM abilities" in rep["overall_note"]
    assert rep["judge_protocol"] == "corrected" and rep["settings"]["answer_max_new_tokens"] == 512
    saved = json.loads((tmp_path / "report.json").read_text())
    assert saved["segments"]["100K-3"]["segments"] == 22
    md = (tmp_path / "report.md").read_text()
    assert "| **overall (memgym's: mean of the abilities)** | 0.500 |" in md and "| 100K-3 | 1 | 22 | 1 |" in md
    assert "judge_protocol: `corrected`" in md


def test_beam_config_errors_name_the_flag():
    import pytest

    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig
    from memgym.llm.errors import ConfigError

    with pytest.raises(ConfigError, match="--split: 'sft' is not a beam split; expected one of train, valid, test"):
        EvalConfig(dataset="beam", split="sft", scorer="rubric-recall")
    with pytest.raises(ConfigError, match="--conversations: BEAM chat ids 100K-99 not found"):
        EvalConfig(dataset="beam", conversations=["100K-99"], scorer="rubric-recall")
    with pytest.raises(ConfigError, match="--scorer rubric-recall needs --dataset beam"):
        ProgramEvalConfig(dataset="locomo", scorer="rubric-recall")
    assert ProgramEvalConfig(dataset="beam", split="test", scorer="rubric-recall", extractor="instruction").split == "test"


def test_program_eval_beam_rubric_recall_headline(tmp_path):
    """``memgym program eval`` on BEAM: scripted instruction extraction (each transcript line one
    unit), the question as the query, rubric-recall, and BEAM's per-ability headline."""
    from memgym.evolution.evaluation.program_eval import ProgramEvalConfig, run_program_eval
    from memgym.evolution.execution.stage_cache import StageCache
    from memgym.memory_bank.programs import reference_program_path

    task = "openai:http://stub.invalid/v1#task"

    def script(messages, params):
        user = messages[-1]["content"]
        lines = [ln.split(": ", 1)[1] for ln in user.splitlines() if ln[:1] == "[" and ln[1:2].isdigit()]
        return json.dumps([{"content": t[:40]} for t in lines])  # short: the stub counts words as tokens

    rt = Runtime(embedder=HashEmbedder(dim=64))
    rt.register(task, ScriptedBackend(script))
    cfg = ProgramEvalConfig(program=str(reference_program_path()), dataset="beam", conversations=["100K-3"],
                            n_sessions=1, extractor="instruction", task_model=task, plan_mode="question",
                            scorer="rubric-recall", validate=False, diagnostics=False, progress=False,
                            out=str(tmp_path))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DataQuirkWarning)
        rep = run_program_eval(cfg, rt, StageCache())
    assert rep.ok and rep.n == 8 and rep.extraction["units"] == 58
    head = rep.summary
    # the 40-character units hold none of the rubric items of these 8 questions: every ability scores 0,
    # and so does the headline (hand-made non-zero BEAM headlines: tests/rewards/scoring/test_official.py)
    assert head["by_ability"] == {
        "contradiction_resolution": 0.0, "information_extraction": 0.0, "instruction_following": 0.0,
        "knowledge_update": 0.0, "preference_following": 0.0, "temporal_reasoning": 0.0}
    assert head["overall"] == 0.0 and rep.overall == 0.0
    assert "## beam headline" in (tmp_path / "report.md").read_text()
