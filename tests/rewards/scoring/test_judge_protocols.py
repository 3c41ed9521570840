"""The official judge protocols (issue 16): request bodies byte for byte against the data
files' templates filled in by hand, reply-parsing tables per protocol, and BEAM's event
ordering on hand-made pairs (tau-b over the union, by scipy, ranks written out by hand)."""
from __future__ import annotations

import json
import math
import re

import pytest
from scipy.stats import kendalltau

from memgym.data_synth.datasets import load_conversations
from memgym.data_synth.paths import data_root
from memgym.llm.cache import ResponseCache
from memgym.llm.runtime import Runtime
from memgym.rewards.scoring import judge_protocols as P
from memgym.rewards.scoring.judge import ScoreItem
from memgym.rewards.scoring.scorers import make_scorer
from tests.fake_judge import FakeJudge, user_text
from tests.helpers import ScriptedBackend

JUDGES = data_root() / "judges"


def _file(name):
    return json.loads((JUDGES / name).read_text(encoding="utf-8"))


def _items(convs):
    return [ScoreItem(q.question, q.answer, f"Prediction for {q.id}:\nsecond line kept", "", q.category, q.id, q.rubric)
            for c in convs for q in c.questions]


def _run(spec_reply, dataset, items, protocol="official"):
    with FakeJudge(spec_reply) as fj:
        rt = Runtime(cache=None)
        scorer = make_scorer("llm", rt.backend(fj.spec, role="judge"), dataset=dataset, judge_protocol=protocol)
        scores = scorer.score(items)
    return scorer, scores, fj.bodies


def _key(body):
    return json.dumps(body["messages"], sort_keys=True)


# ------------------------------------------------------------------ request bodies, byte for byte


def test_longmemeval_request_bodies_equal_the_templates_filled_by_hand():
    ids = ["001be529", "06878be2", "0862e8bf_abs"]  # single-session-user, preference, abstention
    convs = load_conversations("longmemeval", None, ids=ids)
    items = _items(convs)
    assert [it.qid for it in items] == ids
    lme = _file("longmemeval.json")
    t = lme["templates"]
    expected = [
        t["single-session-user"].format(items[0].question, "over a year", items[0].prediction),
        t["single-session-preference"].format(items[1].question, items[1].gold, items[1].prediction),
        t["abstention"].format(items[2].question, items[2].gold, items[2].prediction),
    ]
    replies = {e: r for e, r in zip(expected, ["Yes.", "no", "Eyes"])}
    scorer, scores, bodies = _run(lambda b: replies[user_text(b)], "longmemeval", items)
    assert sorted(_key(b) for b in bodies) == sorted(json.dumps([{"role": "user", "content": e}], sort_keys=True)
                                                     for e in expected)
    for b in bodies:
        assert (b["temperature"], b["max_tokens"]) == (0, 10) and len(b["messages"]) == 1
        assert "response_format" not in b
    assert scores == [1.0, 0.0, 1.0]  # "Eyes" contains "yes": the official substring rule
    assert scorer.stats.prompts == 3 and scorer.stats.unreadable == 0
    assert scorer.last[0].calls[0]["reply"] == "Yes." and "\nsecond line kept" in scorer.last[0].calls[0]["messages"][0]["content"]


def _beam_items():
    convs = load_conversations("beam", None, ids=["100K-3"])
    qs = {q.id: q for q in convs[0].questions}
    pick = ["100K-3:information_extraction:1", "100K-3:information_extraction:2", "100K-3:summarization:1"]
    return [ScoreItem(qs[i].question, qs[i].answer, f"Answer to {i}\n\nwith a blank line", "", qs[i].category, i,
                      qs[i].rubric) for i in pick]


@pytest.mark.parametrize("protocol", ["official", "corrected"])
def test_beam_rubric_request_bodies_equal_the_prompt_filled_by_hand(protocol):
    items = _beam_items()
    prompt = _file("beam.json")["rubric_prompt"]
    expected = []
    for it in items:
        base = prompt if protocol == "official" else prompt.replace("<question>", it.question)
        expected += [base.replace("<rubric_item>", r).replace("<llm_response>", it.prediction) for r in it.rubric]
    assert len(expected) == 1 + 2 + 4
    scorer, scores, bodies = _run(lambda b: '{"score": 0.5, "reason": "partly"}', "beam", items, protocol)
    assert sorted(user_text(b) for b in bodies) == sorted(expected)
    for b in bodies:
        assert len(b["messages"]) == 1 and b["messages"][0]["role"] == "user" and b["temperature"] == 0
        assert b["max_tokens"] == P.DEFAULT_MAX_TOKENS["beam_rubric"]  # memgym's: the official request sets none
    assert ("<question>" in expected[0]) is (protocol == "official")
    assert scores == ([0.0, 0.0, 0.0] if protocol == "official" else [0.5, 0.5, 0.5])


def test_beam_event_ordering_request_bodies_equal_the_official_messages():
    convs = load_conversations("beam", None, ids=["100K-3"])
    q = next(q for q in convs[0].questions if q.id == "100K-3:event_ordering:1")
    ref = list(q.rubric)
    answer = "\n".join([ref[1], ref[0], ref[2]])
    eo = _file("beam.json")["event_ordering"]
    system = eo["equivalence_system_message"]

    def user(first, second):  # the f-string of compute_metrics.py, written out by hand
        return f"""First snippet: {first} \n
                       Second snippet: {second}
                    """

    def reply(body):
        m = re.match(r"First snippet: (.*) \n\n {23}Second snippet: (.*)\n {20}$", user_text(body), re.DOTALL)
        return "YES" if m.group(1) == m.group(2) else "NO"

    scorer, scores, bodies = _run(reply, "beam", [ScoreItem(q.question, q.answer, answer, "", q.category, q.id,
                                                            q.rubric)])
    # line 0 (= ref[1]) vs all three; line 1 (= ref[0]) vs ref 0, 2; line 2 vs ref 2
    expected = [(ref[0], ref[1]), (ref[1], ref[1]), (ref[2], ref[1]), (ref[0], ref[0]), (ref[2], ref[0]),
                (ref[2], ref[2])]
    assert sorted(_key(b) for b in bodies) == sorted(
        json.dumps([{"role": "system", "content": system}, {"role": "user", "content": user(a, b)}], sort_keys=True)
        for a, b in expected)
    assert all(b["temperature"] == 0 for b in bodies)
    assert scores == [pytest.approx((kendalltau([1, 2, 3], [2, 1, 3], variant="b").statistic + 1) / 2)]


def test_locomo_membuilder_request_bodies_equal_the_prompt_filled_by_hand():
    convs = load_conversations("locomo", None, ids=["conv-26"], max_questions=3)
    items = _items(convs)
    prompt = _file("locomo_membuilder.json")["prompt"]
    expected = [prompt.format(question=it.question, gold_answer=it.gold, generated_answer=it.prediction)
                for it in items]
    assert items[0].question == "When did Caroline go to the LGBTQ support group?" and items[0].gold == "7 May 2023"
    replies = dict(zip(expected, ['{"label": "CORRECT"}', '```json\n{"label": "WRONG"}\n```', "CORRECT"]))
    scorer, scores, bodies = _run(lambda b: replies[user_text(b)], "locomo", items)
    assert sorted(user_text(b) for b in bodies) == sorted(expected)
    for b in bodies:
        assert len(b["messages"]) == 1 and b["messages"][0]["role"] == "user" and b["temperature"] == 0
        assert b["response_format"] == {"type": "json_object"}
    assert scores == [1.0, 0.0, 1.0]


# ------------------------------------------------------------------ reply tables


@pytest.mark.parametrize("reply,label", [("yes", True), ("Yes.", True), ("Eyes", True), ("YES, it is", True),
                                         ("no", False), ("No. Saying yes would be wrong", True), ("", False),
                                         ("  nO ", False), ("The answer is correct", False)])
def test_longmemeval_reply_rule(reply, label):
    assert P.longmemeval_label(reply) is label


@pytest.mark.parametrize("reply,official,corrected", [
    ('{"score": 1}', 1.0, 1.0), ('{"score": 1.0, "reason": "ok"}', 1.0, 1.0), ('{"score": 0.5}', 0.0, 0.5),
    ('{"score": 0.0}', 0.0, 0.0), ('{"score": "1"}', 1.0, 1.0), ('{"score": "0.5"}', None, 0.5),
    ('```json\n{"score": 0.5, "reason": "x"}\n```', 0.0, 0.5), ('Verdict: {"score": 1.0, "reason": "y"} end', 1.0, 1.0),
    ("no json here", None, None), ('{"reason": "no score"}', None, None), ('[{"score": 1}]', None, None)])
def test_beam_reply_rule(reply, official, corrected):
    assert P.beam_item_score(reply, "official") == official
    assert P.beam_item_score(reply, "corrected") == corrected


@pytest.mark.parametrize("reply,score,readable", [
    ('{"label": "CORRECT"}', 1.0, True), ('```json\n{"label": "WRONG"}\n```', 0.0, True), ("CORRECT", 1.0, True),
    ("CORRECT or WRONG", 0.0, True), ('{"label": "correct"}', 0.0, True), ("garbage", 0.0, False),
    ('{"verdict": "CORRECT"}', 0.0, True), ('The answer is {"label": "CORRECT"}.', 1.0, True)])
def test_membuilder_reply_rule(reply, score, readable):
    assert P.membuilder_label(reply) == (score, readable)


@pytest.mark.parametrize("reply,same", [("YES", True), ("**Yes**", True), ("no", False), ("eyes", True), ("", False)])
def test_beam_equivalence_reply_rule(reply, same):
    assert P.beam_equivalence_label(reply) is same


# ------------------------------------------------------------------ BEAM event ordering, by hand

A, B, C = "Basic responsive components setup", "Styling classes integration", "Modal bug fix"


def _norm(ref_ranks, sys_ranks):
    tau = kendalltau(ref_ranks, sys_ranks, variant="b").statistic
    return (tau + 1) / 2


# union order, reference ranks, answer ranks (tie rank = len(union) + 1), all by hand
EVENT_CASES = {
    "perfect": ([A, B, C], [A, B, C], _norm([1, 2, 3], [1, 2, 3])),
    "reversed": ([A, B, C], [C, B, A], _norm([1, 2, 3], [3, 2, 1])),
    "one swap": ([A, B, C], [B, A, C], _norm([1, 2, 3], [2, 1, 3])),
    "intro line": ([A, B, C], ["Here is the order:", A, B, C], _norm([1, 2, 3, 5], [2, 3, 4, 1])),
    "blank lines": ([A, B, C], [A, "", B, "", C], _norm([1, 2, 3, 5], [1, 3, 5, 4])),
    "extra wrong event": ([A, B, C], [A, "A trip to Rome", B, C], _norm([1, 2, 3, 5], [1, 3, 4, 2])),
    "empty answer": ([A, B, C], [""], _norm([1, 2, 3, 5], [5, 5, 5, 1])),
    "one gold item": ([A], [A], math.nan),
}


@pytest.mark.parametrize("case", list(EVENT_CASES))
def test_beam_event_ordering_by_hand(case):
    ref, lines, expected = EVENT_CASES[case]

    def reply(body):
        m = re.match(r"First snippet: (.*) \n\n {23}Second snippet: (.*)\n {20}$", user_text(body), re.DOTALL)
        return "YES" if m.group(1) == m.group(2) else "NO"

    item = ScoreItem("Order?", "", "\n".join(lines), "", "event_ordering", "x", tuple(ref))
    scorer, (score,), _ = _run(reply, "beam", [item])
    assert scorer.last[0].detail["aligned"] == lines
    if math.isnan(expected):
        assert math.isnan(score)
    else:
        assert score == pytest.approx(expected, abs=1e-12)
        assert {"perfect": 1.0, "reversed": 0.0, "one swap": 2 / 3}.get(case, score) == pytest.approx(score)


def test_corrected_is_beam_only():
    with pytest.raises(ValueError, match="beam only"):
        make_scorer("llm", object(), dataset="longmemeval", judge_protocol="corrected")
    with pytest.raises(ValueError, match="official, corrected"):
        P.check_protocol("beam", "fixed")


def test_membuilder_json_mode_on_a_local_hf_judge(tiny_model_dir):
    """MemBuilder's JSON-object request on the hf backend: decoded under ``{"type": "object"}``
    (llguidance), so even a random-weight judge answers a JSON object; read by the official rule."""
    from memgym.llm.hf_backend import HFBackend

    judge = HFBackend(tiny_model_dir, batch_size=4)
    scorer = make_scorer("llm", judge, dataset="locomo")
    items = [ScoreItem("When did Caroline go to the LGBTQ support group?", "7 May 2023", "On 7 May 2023.", "", "2",
                       "conv-26/q0")]
    scores = scorer.score(items)
    reply = scorer.last[0].calls[0]["reply"]
    assert scores[0] in (0.0, 1.0) and reply.lstrip().startswith("{")
    assert scorer.last[0].calls[0]["params"]["response_format"] == {"type": "json_object"}


def test_the_judge_protocol_is_part_of_the_response_cache_key(tmp_path):
    """Event-ordering equivalence requests are the same text under both BEAM protocols; the
    cache key still differs by protocol, and a repeat under the same protocol is free."""
    item = ScoreItem("Order?", "", "a\nb", "", "event_ordering", "x", ("a", "b"))
    with FakeJudge(lambda body: "NO") as fj:
        rt = Runtime(cache=ResponseCache(tmp_path / "responses.sqlite"))
        judge = rt.backend(fj.spec, role="judge")
        for protocol, new_requests in (("official", 4), ("corrected", 4), ("official", 0), ("corrected", 0)):
            before = len(fj.bodies)
            make_scorer("llm", judge, dataset="beam", judge_protocol=protocol).score([item])
            assert len(fj.bodies) - before == new_requests, protocol


# ------------------------------------------------------------------ protocols trusted by content


def _edited_judges(tmp_path, monkeypatch) -> "Path":
    """$MEMGYM_DATA in tmp: the shipped data linked, judges/ copied, MemBuilder's prompt edited to
    always answer CORRECT."""
    import os
    import shutil

    root = tmp_path / "data"
    root.mkdir()
    for p in data_root().iterdir():
        if p.name != "judges":
            (root / p.name).symlink_to(p)
    shutil.copytree(JUDGES, root / "judges")
    f = root / "judges" / "locomo_membuilder.json"
    os.chmod(f, 0o644)
    d = json.loads(f.read_text(encoding="utf-8"))
    d["prompt"] = 'Reply {{"label": "CORRECT"}} whatever {question} {gold_answer} {generated_answer} say.'
    f.write_text(json.dumps(d, indent=2), encoding="utf-8")
    monkeypatch.setenv("MEMGYM_DATA", str(root))
    return f


def _sha(path) -> str:
    import hashlib
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_the_official_hashes_are_the_shipped_files():
    assert P.OFFICIAL_SHA256 == {name: _sha(JUDGES / name) for name in
                                 ("longmemeval.json", "beam.json", "locomo_membuilder.json")}
    assert [P.official_file_problem(d) for d in ("locomo", "longmemeval", "beam")] == ["", "", ""]
    from pathlib import Path

    import memgym.data_synth as data_synth
    manifest = json.loads((Path(data_synth.__file__).parent / "data_manifest.json").read_text())
    pins = manifest["files"]  # memgym data download checks the same files against these
    assert {n: pins[f"judges/{n}"]["sha256"] for n in P.OFFICIAL_SHA256} == P.OFFICIAL_SHA256


def test_a_changed_official_file_is_refused_and_runs_only_as_custom(tmp_path, monkeypatch):
    edited = _edited_judges(tmp_path, monkeypatch)
    sha = _sha(edited)
    item = ScoreItem("When did Caroline go to the LGBTQ support group?", "7 May 2023", "Never.", "", "2", "conv-26/q0")
    with pytest.raises(P.JudgeProtocolError) as ei:
        make_scorer("llm", ScriptedBackend(lambda m, p: "unused"), dataset="locomo")
    msg = str(ei.value)
    assert ei.value.exit_status == 2 and "\n" not in msg
    assert msg == (f"judge protocol file {edited} is not the official locomo protocol: sha256 {sha}, expected "
                   f"{P.OFFICIAL_SHA256['locomo_membuilder.json']}; a changed protocol runs only as judge_protocol "
                   f"custom:{edited}")
    with FakeJudge(lambda body: '{"label": "CORRECT"}') as fj:
        scorer = make_scorer("llm", Runtime(cache=None).backend(fj.spec, role="judge"), dataset="locomo",
                             judge_protocol=f"custom:{edited}")
        assert scorer.score([item]) == [1.0]
    assert user_text(fj.bodies[0]) == f'Reply {{"label": "CORRECT"}} whatever {item.question} 7 May 2023 Never. say.'
    assert scorer.note == (f"locomo CUSTOM judge protocol {edited} (sha256 {sha[:16]}), not the benchmark's official "
                           "one: its numbers are not comparable with published ones")
    assert "MemBuilder" not in scorer.note
    longmemeval = make_scorer("llm", ScriptedBackend(lambda m, p: "no"), dataset="longmemeval")  # the untouched files still run as official
    assert longmemeval.note.startswith("LongMemEval official")


def test_data_check_score_and_recipes_refuse_a_changed_protocol(tmp_path, monkeypatch, capsys):
    from memgym.launch.cli import main

    edited = _edited_judges(tmp_path, monkeypatch)
    sha, want = _sha(edited), P.OFFICIAL_SHA256["locomo_membuilder.json"]
    assert main(["data", "check"]) == 1
    out, err = capsys.readouterr()
    judge_lines = [ln for ln in out.splitlines() if "judge protocol" in ln]
    assert len(judge_lines) == 3 and judge_lines[0].startswith("BAD  judge protocol locomo")
    assert f"sha256 {sha}, expected {want}" in judge_lines[0]
    assert all(ln.startswith("ok   judge protocol") for ln in judge_lines[1:])
    assert err.strip() == "memgym data check: 1 of 11 items missing or wrong: judge protocol locomo"

    preds = tmp_path / "p.jsonl"
    preds.write_text(json.dumps({"question_id": "conv-26/q0", "prediction": "7 May 2023"}) + "\n")
    with FakeJudge(lambda body: '{"label": "CORRECT"}') as fj:
        args = ["score", "--dataset", "locomo", "--predictions", str(preds), "--judge", fj.spec, "--cache", "none",
                "--allow_partial"]
        assert main([*args, "--out", str(tmp_path / "official")]) == 2
        errors = [ln for ln in capsys.readouterr().err.splitlines() if not ln.startswith("warning: locomo10.json")]
        assert len(errors) == 1 and f"sha256 {sha}, expected {want}" in errors[0] and not fj.bodies
        assert main([*args, "--judge_protocol", f"custom:{edited}", "--out", str(tmp_path / "custom")]) == 0
    scores = json.loads((tmp_path / "custom" / "scores.json").read_text())
    assert scores["judge_protocol"] == f"custom:{edited}" and scores["overall"] == 1.0
    report = (tmp_path / "custom" / "report.md").read_text()
    assert f"CUSTOM judge protocol {edited} (sha256 {sha[:16]})" in report and "422d053" not in report

    capsys.readouterr()
    recipe = ["--config", "launch/recipes/demo_evolve.yaml", "--scorer", "llm", "--judge_model",
              "openai:http://127.0.0.1:9/v1#judge", "--out", str(tmp_path / "evo")]
    assert main(["evolve", *recipe]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and f"sha256 {sha}, expected {want}" in err
    assert not (tmp_path / "evo" / "recipe.json").exists()
