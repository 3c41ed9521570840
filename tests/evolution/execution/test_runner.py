"""The stage-cached program runner: component diff, reuse measured as counts, copies of reused
state, the disk cache, and ``memgym program eval`` (incl. a trained extractor via hf:)."""
from __future__ import annotations

import json

import pytest

from memgym.evolution.execution.component_diff import COMPONENTS, component_hashes, diff_components, stage_component_hashes
from memgym.evolution.execution.runner import ProgramRunError, ProgramRunner, RunnerSettings
from memgym.evolution.execution.stage_cache import StageCache
from memgym.llm.embeddings import HashEmbedder
from memgym.llm.runtime import Runtime
from memgym.memory_bank.contract import FieldSpec, session_entries, text_query, unit_text
from memgym.memory_bank.programs import read_program_source, reference_program_path, seed_program_path
from tests.helpers import TASK, LengthMarked, Script, ScriptedBackend, conversation

SEED = read_program_source(seed_program_path())
REF = read_program_source(reference_program_path())

RETRIEVAL_ONLY = REF.replace('return "\\n".join(self.lines[i] for i in sorted(chosen))',
                             'return "\\n".join(self.lines[i] for i in chosen)')
EXTRACTION_CHANGE = REF.replace("extract every fact worth remembering", "extract every durable fact")
HELPER_CHANGE = REF.replace("TIME_BONUS = 0.1", "TIME_BONUS = 0.2")


class CountingEmbedder(HashEmbedder):
    def __init__(self):
        super().__init__(dim=128)
        self.texts = 0

    def encode(self, texts):
        self.texts += len(texts)
        return super().encode(texts)


def make_runner(cache=None, **kw):
    script = Script()
    rt = Runtime(embedder=CountingEmbedder())
    rt.register(TASK, ScriptedBackend(script, model_id="task"))
    settings = RunnerSettings(**{"extractor": "instruction", "task_model": TASK, "scorer": "answer-recall", **kw})
    return ProgramRunner(rt, settings, cache), script, rt


# ------------------------------------------------------------------ component diff


def test_component_diff_finds_the_earliest_stage():
    assert diff_components(REF, RETRIEVAL_ONLY).changed == ("retrieval",)
    assert diff_components(REF, RETRIEVAL_ONLY).start_stage == "retrieve"
    assert diff_components(REF, RETRIEVAL_ONLY).reused_stages == ("extract", "index", "plan")
    assert diff_components(REF, EXTRACTION_CHANGE).start_stage == "extract"
    assert diff_components(REF, HELPER_CHANGE).to_dict() == {"changed": ["shared"], "start_stage": "index",
                                                             "reused_stages": ["extract"]}
    assert diff_components(REF, REF.replace('"Answer the question from', '"Answer this question from')).changed \
        == ("answer",)
    assert diff_components(REF, REF.replace("time_hint: Optional[str] = None", "time_hint: Optional[str] = ''")) \
        .start_stage == "plan"
    # a class attribute or a new method of Memory is indexing; a docstring or comment is nothing
    assert diff_components(REF, REF.replace("    def _matrix(self):", "    LIMIT = 3\n\n    def _matrix(self):")) \
        .changed == ("indexing",)
    cosmetic = REF.replace('"""Dated unit lines with one embedding row each."""', '"""Other words."""  # note')
    assert diff_components(REF, cosmetic).changed == () and diff_components(REF, cosmetic).start_stage is None
    assert diff_components(SEED, REF).changed == COMPONENTS


def test_stage_hashes_are_cumulative():
    a, b = stage_component_hashes(component_hashes(REF)), stage_component_hashes(component_hashes(RETRIEVAL_ONLY))
    assert [s for s in a if a[s] == b[s]] == ["extract", "index", "plan"]
    c = stage_component_hashes(component_hashes(HELPER_CHANGE))
    assert [s for s in a if a[s] == c[s]] == ["extract"]


# ------------------------------------------------------------------ reuse as counts


def test_reuse_counts_retrieval_extraction_and_helper_changes():
    runner, script, rt = make_runner(diagnostics=False)
    conv = [conversation()]
    parent = runner.run(REF, conv)
    assert script.counts == {"extract": 3, "plan": 4, "answer": 0}  # answer-recall needs no answer
    assert parent.stage_items["index"] == {"run": 3, "reused": 0} and parent.stages_run == [
        "extract", "index", "plan", "retrieve", "score"]
    assert parent.answer_skipped and parent.extraction["units"] == 6
    emb_after_parent = rt.embedder.texts

    script.counts = dict.fromkeys(script.counts, 0)
    child = runner.run(RETRIEVAL_ONLY, conv, parent_source=REF)
    assert script.counts == {"extract": 0, "plan": 0, "answer": 0}
    assert child.stage_items["extract"] == {"run": 0, "reused": 3}
    assert child.stage_items["index"] == {"run": 0, "reused": 3}
    assert child.stage_items["retrieve"] == {"run": 4, "reused": 0}
    assert rt.embedder.texts - emb_after_parent == 4  # only the 4 query texts; no unit re-embedded
    assert child.stages_reused == ["extract", "index", "plan"] and child.diff.start_stage == "retrieve"

    script.counts = dict.fromkeys(script.counts, 0)
    ext = runner.run(EXTRACTION_CHANGE, conv, parent_source=REF)
    assert script.counts == {"extract": 3, "plan": 4, "answer": 0}
    assert ext.stage_items["index"] == {"run": 3, "reused": 0} and ext.stages_reused == []

    script.counts = dict.fromkeys(script.counts, 0)
    helper = runner.run(HELPER_CHANGE, conv, parent_source=REF)
    assert script.counts == {"extract": 0, "plan": 4, "answer": 0}
    assert helper.stage_items["extract"] == {"run": 0, "reused": 3}
    assert helper.stage_items["index"] == {"run": 3, "reused": 0}
    assert helper.stages_reused == ["extract"]

    # reuse changes cost, never results: the retrieval-only child from scratch scores the same
    fresh, _, _ = make_runner(diagnostics=False)
    full = fresh.run(RETRIEVAL_ONLY, conv)
    assert [t.retrieved for t in full.tasks] == [t.retrieved for t in child.tasks]
    assert [t.score for t in full.tasks] == [t.score for t in child.tasks]
    assert full.tasks[0].score == 1.0  # "LGBTQ support group" is in the retrieved lines


EXTRACTOR = "openai:http://stub.invalid/v1#extractor"  # a registered ScriptedBackend, never contacted


def episodic_extractor(messages, params) -> str:
    """A trained extractor stand-in: the episodic manager ADDs every transcript turn's text
    (``[s1:0] Caroline: text`` lines); core, semantic and procedural change nothing."""
    user = messages[-1]["content"]
    manager = user.rsplit("JSON for the ", 1)[1].split(" part", 1)[0]
    if manager == "core":
        return '{"operation": "NONE"}'
    if manager != "episodic":
        return '{"operations": []}'
    turns = [ln.split(": ", 1)[1] for ln in user.splitlines() if ln.startswith("[s")]
    return json.dumps({"operations": [{"action": "ADD", "memory": t} for t in turns]})


def test_trained_extractor_units_flow_into_the_programs_index():
    runner, script, rt = make_runner(diagnostics=False, extractor=EXTRACTOR)
    rt.register(EXTRACTOR, ScriptedBackend(episodic_extractor, model_id="extractor"))
    run = runner.run(REF, [conversation()])
    assert rt.calls["extractor"] == 12  # 3 sessions x 4 managers
    assert script.counts == {"extract": 0, "plan": 4, "answer": 0}  # no instruction extraction
    assert run.extraction["mode"] == "extractor" and run.extraction["units"] == 6
    units = run.traces[0].units
    assert [len(u) for u in units] == [2, 2, 2]
    assert units[0][0]["content"] == "Caroline went to the LGBTQ support group"
    assert [u["date"] for u in units[1]] == ["2023-05-08", "2023-05-08"]  # the session's date
    # what the program indexed comes back from retrieve, dated by the reference program
    assert "[2023-05-15] Caroline gave a talk at the school" in run.tasks[2].retrieved
    # answer-recall: the gold tokens of q0, q1 and q3 are all retrieved; q2's "15 May 2023" is
    # written 2023-05-15 in memory, so none of its tokens match
    assert [t.score for t in run.tasks] == [1.0, 1.0, 0.0, 1.0]
    assert run.stage_items["index"] == {"run": 3, "reused": 0}


def test_expert_extraction_replays_the_trajectory_into_units():
    """``expert:conv-30`` on the first 2 real LoCoMo sessions: session 1's expert ops add 5
    episodic + 7 semantic entries and append to core (13 units); session 2's add 3 episodic,
    4 semantic, update 1 semantic entry and replace text in core (9 units)."""
    from memgym.data_synth.datasets import load_conversations

    conv = load_conversations("locomo", ids=["conv-30"], n_sessions=2)
    runner, script, rt = make_runner(diagnostics=False, extractor="expert:conv-30", plan_mode="question")
    run = runner.run(SEED, conv)
    assert [len(u) for u in run.traces[0].units] == [13, 9]
    assert run.extraction["mode"] == "expert" and run.extraction["units"] == 22
    assert script.counts == {"extract": 0, "plan": 0, "answer": 0} and not rt.calls.get("extractor")
    assert len(run.tasks) == len(conv[0].questions) and run.stage_items["index"] == {"run": 2, "reused": 0}


def test_answer_stage_runs_for_f1_and_is_reused():
    runner, script, _ = make_runner(diagnostics=False, scorer="f1")
    runner.run(SEED, [conversation()])
    assert script.counts == {"extract": 3, "plan": 4, "answer": 4}
    again = runner.run(SEED, [conversation()])
    assert script.counts["answer"] == 4 and again.stage_items["answer"] == {"run": 0, "reused": 4}
    assert all(t.prediction == "stub" and t.score == 0.0 for t in again.tasks)


STATEFUL = '''
from dataclasses import dataclass
EXTRACTION_INSTRUCTION = "Extract facts."
PLANNING_INSTRUCTION = "Plan."
ANSWER_INSTRUCTION = "Answer."

@dataclass
class MemoryUnit:
    content: str

@dataclass
class Query:
    question: str

class Memory:
    def __init__(self, toolkit):
        self.lines = []
        self.seen = []

    def index(self, units, session):
        self.lines.extend(u.content for u in units)

    def retrieve(self, query):
        self.seen.append(query.question)
        return "TAG seen=%d\\n" % len(self.seen) + "\\n".join(self.lines)
'''


def test_reused_memory_is_a_copy_not_the_parents_live_state(tmp_path):
    runner, script, _ = make_runner(cache=StageCache(tmp_path / "stages.sqlite"), diagnostics=False)
    conv = [conversation()]
    parent = runner.run(STATEFUL, conv)
    assert [t.retrieved.split("\n")[0] for t in parent.tasks] == ["TAG seen=1", "TAG seen=2", "TAG seen=3",
                                                                  "TAG seen=4"]
    child_src = STATEFUL.replace("TAG seen", "CHILD seen")
    child = runner.run(child_src, conv, parent_source=STATEFUL)
    assert child.stage_items["index"] == {"run": 0, "reused": 3}
    # restored from the snapshot taken right after indexing: the parent's 4 queries are not in it
    assert child.tasks[0].retrieved.split("\n")[0] == "CHILD seen=1"
    assert child.tasks[0].retrieved.split("\n")[1:] == parent.tasks[0].retrieved.split("\n")[1:]

    # the disk cache serves a new runner (new process state): everything reused, no LLM call
    runner.cache.close()
    again, script2, _ = make_runner(cache=StageCache(tmp_path / "stages.sqlite"), diagnostics=False)
    rerun = again.run(child_src, conv)
    assert script2.counts == {"extract": 0, "plan": 0, "answer": 0}
    assert rerun.stages_run == [] and rerun.stage_items["retrieve"] == {"run": 0, "reused": 4}
    assert [t.retrieved for t in rerun.tasks] == [t.retrieved for t in child.tasks]


def test_extraction_parse_failures_and_bad_programs_are_reported():
    runner, _, rt = make_runner(diagnostics=False)
    rt.register(TASK, ScriptedBackend(lambda m, p: "not json at all" if "memory units" in m[-1]["content"]
                                      else '{"search_text": "x"', model_id="task"))
    run = runner.run(REF, [conversation()])
    assert run.extraction["format_failures"] == 3 and run.extraction["units"] == 0
    assert all(t.retrieved == "" and t.score == 0.0 for t in run.tasks)
    assert run.plan_failures == 0  # '{"search_text": "x"' is repaired by json_repair
    with pytest.raises(ProgramRunError, match="syntax error"):
        runner.run("def broken(:\n", [conversation()])
    with pytest.raises(ProgramRunError, match="level 1"):
        runner.run(SEED.replace("class Memory:", "class Memo:"), [conversation()])
    raising = SEED.replace('        return "\\n".join(self.lines)[:OUT_CHAR_BUDGET]',
                           '        raise ValueError("boom")')
    bad = runner.run(raising, [conversation()])
    assert bad.retrieve_errors == 4 and "boom" in bad.tasks[0].error


# ------------------------------------------------------------------ stage helpers


def test_text_query_unit_text_and_session_entries():
    f = [FieldSpec("k", "int"), FieldSpec("topic", "str"), FieldSpec("search_text", "str"),
         FieldSpec("hint", "str", optional=True, required=False, default="x")]
    assert text_query(f, "e") == {"k": 0, "topic": "", "search_text": "e", "hint": "x"}
    assert text_query([FieldSpec("tags", "list[str]")], "e") == {"tags": ["e"]}
    assert text_query([FieldSpec("n", "int")], "e") is None
    assert unit_text({"date": "2023", "content": "c"}, [FieldSpec("date", "str"), FieldSpec("content", "str")]) == "c"
    assert unit_text({"who": "Al", "tags": ["a"]}, [FieldSpec("who", "str"), FieldSpec("tags", "list[str]")]) == "Al"
    before = {"core": "old", "episodic": [{"id": "E1", "text": "2023-01-02: x", "updated": 1}]}
    after = {"core": "new", "episodic": [{"id": "E1", "text": "2023-01-02: x", "updated": 1},
                                         {"id": "E2", "text": "2023-02-03: y | Details: z", "updated": 2}],
             "semantic": [{"id": "S1", "text": "Al - job: cook", "updated": 2}], "procedural": []}
    assert session_entries(before, after, 2, "2023-02-05") == [
        {"part": "core", "id": "core", "text": "new", "date": "2023-02-05", "session": 2},
        {"part": "episodic", "id": "E2", "text": "2023-02-03: y | Details: z", "date": "2023-02-03", "session": 2},
        {"part": "semantic", "id": "S1", "text": "Al - job: cook", "date": "2023-02-05", "session": 2}]


# ------------------------------------------------------------------ CLI


# ------------------------------------------------------------------ turns extraction, workers, typed result


def test_turns_extraction_maps_every_turn_without_a_model_call():
    from memgym.memory_bank.contract import turn_entries

    conv = conversation()
    assert turn_entries(conv.sessions[1]) == [
        {"part": "turn", "id": "s2:0", "text": "Caroline: Caroline is researching adoption agencies", "date": "2023-05-08",
         "session": 2},
        {"part": "turn", "id": "s2:1", "text": "Melanie: Melanie took her kids camping in the mountains",
         "date": "2023-05-08", "session": 2}]
    runner, script, rt = make_runner(diagnostics=False, plan_mode="question")
    runner.settings.extractor = "turns"
    run = runner.run(SEED, [conv])
    assert script.counts == {"extract": 0, "plan": 0, "answer": 0} and rt.calls_snapshot()["calls"].get("task", 0) == 0
    assert run.extraction["mode"] == "turns" and run.extraction["units"] == 6
    assert run.traces[0].units[0][0] == {"content": "Caroline: Caroline went to the LGBTQ support group",
                                         "date": "2023-05-01", "part": "turn", "entry_id": "s1:0", "session": 1}
    # the seed returns every line: every answer's tokens are there except "15 May 2023", whose
    # date only appears as the "[2023-05-15]" prefix (one token "20230515" after normalisation)
    assert [t.score for t in run.tasks] == [1.0, 1.0, 0.0, 1.0]


def test_workers_overlap_conversations_with_identical_results():
    from dataclasses import replace

    convs = [conversation(), replace(conversation(), id="d", sessions=conversation().sessions[:2])]
    r1, _, _ = make_runner(diagnostics=True, plan_mode="question")
    r1.settings.extractor = "turns"
    a = r1.run(REF, convs, workers=1)
    r2, _, _ = make_runner(diagnostics=True, plan_mode="question")
    r2.settings.extractor = "turns"
    b = r2.run(REF, convs, workers=2)
    assert [t.conversation for t in b.tasks] == ["c"] * 4 + ["d"] * 4
    assert [(t.retrieved, t.score) for t in a.tasks] == [(t.retrieved, t.score) for t in b.tasks]
    assert a.stage_items == b.stage_items and b.stage_items["index"] == {"run": 5, "reused": 0}
    assert [tr.probes for tr in a.traces] == [tr.probes for tr in b.traces]


def test_two_evaluations_overlap_on_one_runner():
    from concurrent.futures import ThreadPoolExecutor

    runner, _, _ = make_runner(diagnostics=True, plan_mode="question")
    runner.settings.extractor = "turns"
    with ThreadPoolExecutor(2) as pool:
        a, b = pool.map(lambda src: runner.run(src, [conversation()]), [REF, RETRIEVAL_ONLY])
    solo, _, _ = make_runner(diagnostics=True, plan_mode="question")
    solo.settings.extractor = "turns"
    for run, src in ((a, REF), (b, RETRIEVAL_ONLY)):
        alone = solo.run(src, [conversation()])
        assert [(t.retrieved, t.score) for t in run.tasks] == [(t.retrieved, t.score) for t in alone.tasks]
        assert run.traces[0].probes == alone.traces[0].probes
        # each run counted only its own work (per-run state): 4 questions + 5 known evidence turns probed
        assert sum(run.stage_items["retrieve"].values()) == 4 + 5
        assert run.stage_items["extract"]["run"] + run.stage_items["extract"]["reused"] == 3


def test_program_runner_counts_cut_off_extractions_as_failures():
    rt = Runtime(embedder=HashEmbedder(dim=64))
    rt.register(TASK, LengthMarked(ScriptedBackend(Script(), model_id="task"),
                                   cut=lambda m: "memory units" in m[-1]["content"]))
    runner = ProgramRunner(rt, RunnerSettings(extractor="instruction", task_model=TASK, diagnostics=False))
    run = runner.run(REF, [conversation()])
    assert run.extraction["format_failures"] == 3 and run.extraction["units"] == 0


TOOLKIT_PROGRAM = STATEFUL.replace('''        self.lines = []
        self.seen = []
''', '''        self.toolkit = toolkit
        self.lines = []
        self.seen = []
''').replace('''        self.lines.extend(u.content for u in units)
''', '''        self.lines.extend(u.content for u in units)
        if session["index"] == 1:
            self.lines.append("NOTE " + self.toolkit.llm("Summarise: " + self.lines[0], max_tokens=5))
''').replace('''        self.seen.append(query.question)
''', '''        self.seen.append(query.question)
        self.lines.append("DIM %d" % len(self.toolkit.embed([query.question])[0]))
''')


def test_program_toolkit_calls_are_served_by_the_backend_host_under_the_model_lock():
    """The runner's sandboxes get :class:`BackendToolkitHost`: ``toolkit.llm`` reaches the task
    LLM as one user message with max_new_tokens = max_tokens, ``toolkit.embed`` the run's
    embedder, both while the runner's model lock is held (checked from another thread)."""
    import threading

    from memgym.memory_bank.contract import BackendToolkitHost

    held = []

    def lock_is_held() -> bool:
        got = []
        t = threading.Thread(target=lambda: got.append(runner.model_lock.acquire(blocking=False)))
        t.start()
        t.join()
        if got[0]:
            runner.model_lock.release()
        return not got[0]

    class Task(ScriptedBackend):
        def generate(self, batch, params, **kw):
            held.append(("llm", lock_is_held()))
            return super().generate(batch, params, **kw)

    class Embedder(CountingEmbedder):
        def encode(self, texts):
            held.append(("embed", lock_is_held()))
            return super().encode(texts)

    task = Task(Script(), model_id="task")
    rt = Runtime(embedder=Embedder())
    rt.register(TASK, task)
    runner = ProgramRunner(rt, RunnerSettings(extractor="turns", task_model=TASK, plan_mode="question",
                                              diagnostics=False, program_llm_calls=1))
    box = runner.sandbox(TOOLKIT_PROGRAM)
    assert isinstance(box.toolkit._host, BackendToolkitHost)
    box.close()
    assert held == []  # loading a program calls no model
    run = runner.run(TOOLKIT_PROGRAM, [conversation()])
    (messages, params), = task.seen
    assert messages == [{"role": "user", "content": "Summarise: Caroline: Caroline went to the LGBTQ support group"}]
    assert params.max_new_tokens == 5
    assert held == [("llm", True)] + [("embed", True)] * 4  # one llm call, one embed per question
    assert [t.retrieved.split("\n")[0] for t in run.tasks] == ["TAG seen=1", "TAG seen=2", "TAG seen=3", "TAG seen=4"]
    assert "NOTE stub" in run.tasks[0].retrieved and f"DIM {rt.embedder.dim}" in run.tasks[0].retrieved


# ------------------------------------------------------------------ memories too large to snapshot

#: The seed with 17,000,000 characters of index state: its snapshot (pickled, base64, JSON) is larger
#: than the sandbox's real 16 MiB message cap.
BIG = SEED.replace("        self.lines = []\n", "        self.lines = []\n        self.pad = 'x' * 17_000_000\n", 1)


def test_a_snapshot_over_the_message_cap_costs_a_cache_miss_and_none_is_taken_unwanted(monkeypatch):
    from memgym.evolution.execution.stage_cache import open_stage_cache
    from memgym.evolution.execution.sandbox import SandboxedProgram

    assert not open_stage_cache("none").wants("index")  # program eval --stage_cache none: no later reader
    assert BIG != SEED and SandboxedProgram(SEED).limits.max_message_bytes == 16 << 20
    taken = []
    real_snapshot = SandboxedProgram.snapshot
    monkeypatch.setattr(SandboxedProgram, "snapshot", lambda self: taken.append(1) or real_snapshot(self))
    conv = conversation()
    expected = [1.0, 1.0, 0.0, 1.0]  # the seed's answer-recall: every line back, "15 May 2023" only as a date prefix
    for cache, snapshots in ((StageCache(), 1), (StageCache(snapshots=False), 0)):
        runner, _, _ = make_runner(cache, diagnostics=False, plan_mode="question", extractor="turns",
                                   scorer="answer-recall", progress=False)
        taken.clear()
        with pytest.warns(UserWarning, match="the index snapshot of conversation c is larger than the sandbox's "
                                             "16,777,216-byte message cap: not cached") if snapshots else _nothing():
            run = runner.run(BIG, [conv])
        assert [t.score for t in run.tasks] == expected and len(taken) == snapshots and run.failed == {}
        assert len(cache) == 3 + 4 * 3 and not [k for k in cache._mem if k[0] == "index"]  # 3 extractions; plan,
        # retrieve and score of 4 questions; no index blob
        again = runner.run(BIG, [conv])  # nothing cached for index: it is built again, the rest is reused
        assert again.stage_items["index"] == {"run": 3, "reused": 0} and [t.score for t in again.tasks] == expected


def _nothing():
    import contextlib
    return contextlib.nullcontext()


def test_keep_going_reports_a_failed_conversation_beside_the_others():
    from dataclasses import replace

    good = conversation()
    bad = replace(good, id="bad", speakers=("Caroline", "Nate"), sessions=tuple(
        replace(x, turns=tuple(replace(t, speaker="Nate") if t.speaker == "Melanie" else t for t in x.turns))
        for x in good.sessions))
    failing = SEED.replace("    def index(self, units, session):\n", "    def index(self, units, session):\n"
                           "        if any(u.content.startswith('Nate:') for u in units):\n"
                           "            raise RuntimeError('cannot index Nate')\n", 1)
    runner, _, _ = make_runner(diagnostics=False, plan_mode="question", extractor="turns", scorer="answer-recall")
    with pytest.raises(ProgramRunError, match=r"index \[bad\]: raised: RuntimeError: cannot index Nate"):
        runner.run(failing, [good, bad])
    run = runner.run(failing, [bad, good], keep_going=True)
    assert run.failed == {"bad": "index [bad]: raised: RuntimeError: cannot index Nate"}
    assert [(t.conversation, t.score, t.error) for t in run.tasks[:4]] == [
        ("bad", 0.0, "conversation failed: index [bad]: raised: RuntimeError: cannot index Nate")] * 4
    assert [t.score for t in run.tasks[4:]] == [1.0, 1.0, 0.0, 1.0]  # the good conversation, as the seed scores it
