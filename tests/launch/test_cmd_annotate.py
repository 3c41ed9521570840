"""``memgym annotate`` on the LoCoMo train split with a fake annotator server
(:mod:`tests.data_synth.fake_annotator`): one label per question (304, counted from the shipped
file), kill -9 then rerun completes without duplicates or repeated calls, a rerun into a new file
costs no call (response cache), the test split is refused, and the printed agreement equals the
one computed here from the native mapping and the annotator's rules."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from memgym.data_synth.capabilities import capability_for
from memgym.data_synth.datasets import load_conversations
from memgym.data_synth.paths import data_root
from memgym.launch.cli import main
from tests.data_synth.fake_annotator import rule_label, serve_annotator
from tests.helpers import FaultyServer

ROOT = Path(__file__).resolve().parents[2]


def _qids(path: Path) -> list[str]:
    return [json.loads(line)["qid"] for line in path.read_text().splitlines() if line.strip()]


def test_annotate_locomo_train_resumes_after_kill9_is_cached_and_reports_agreement(tmp_path, capsys):
    raw = json.loads((data_root() / "locomo" / "locomo10.json").read_text())
    n_train = sum(len(s["qa"]) for s in raw if s["sample_id"] in ("conv-26", "conv-30"))
    assert n_train == 304
    server, spec = serve_annotator(server_class=FaultyServer, delay_s=0.02)
    out, cache = tmp_path / "labels.jsonl", tmp_path / "cache.sqlite"
    args = ["annotate", "--dataset", "locomo", "--split", "train", "--annotator", spec, "--out", str(out),
            "--cache", str(cache), "--chunk", "8", "--concurrency", "1"]
    try:
        proc = subprocess.Popen([sys.executable, "-m", "memgym.launch.cli", *args], cwd=ROOT, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
        t0 = time.time()
        while (not out.exists() or len(out.read_text().splitlines()) < 16) and time.time() - t0 < 300:
            time.sleep(0.05)
        proc.kill()  # SIGKILL mid-run
        proc.wait()
        done = _qids(out)
        assert 16 <= len(done) < n_train
        before = server.requests_total
        assert main(args) == 0
        qids = _qids(out)
        assert len(qids) == len(set(qids)) == n_train and qids[:len(done)] == done
        assert server.requests_total - before <= n_train - len(done)  # labels on file were not asked again
        printed = capsys.readouterr().out
        # a rerun into a new file: every reply comes from the response cache, no call reaches the server
        calls = server.requests_total
        assert main([*args[:-6], "--out", str(tmp_path / "again.jsonl"), "--cache", str(cache), "--chunk", "8"]) == 0
        assert server.requests_total == calls and len(_qids(tmp_path / "again.jsonl")) == n_train
        assert "annotator calls this run 0 (304 replies from the response cache)" in capsys.readouterr().out
        # never the test split: one clear error, nothing written
        assert main(["annotate", "--dataset", "locomo", "--split", "test", "--annotator", spec, "--out",
                     str(tmp_path / "test.jsonl")]) == 2
        assert "refuses the locomo test split" in capsys.readouterr().err
        assert not (tmp_path / "test.jsonl").exists()
    finally:
        server.shutdown()
        server.server_close()
    # the agreement, computed independently: native mapping vs the annotator's rules per category
    convs = load_conversations("locomo", ids=["conv-26", "conv-30"])
    per = {}
    for c in convs:
        idx = c.turn_index
        for q in c.questions:
            ev = [idx[e][1].render() for e in dict.fromkeys(q.evidence) if e in idx]
            user = f"Question: {q.question}\nReference answer: {q.answer}\nEvidence:\n" + "\n".join(ev)
            hit = rule_label(user)["primary"] == capability_for("locomo", q.category, q.id).value
            n, m = per.get(q.category, (0, 0))
            per[q.category] = (n + 1, m + hit)
    total = sum(m for _, m in per.values())
    assert f"| **all** | | **{n_train}** | **{total}** | **{total / n_train:.2%}** |" in printed
    assert f"| 2 temporal | T | {per['2'][0]} | {per['2'][1]} |" in printed
    agree = json.loads((tmp_path / "labels.train.agreement.json").read_text())
    assert agree["n"] == n_train and agree["matched"] == total
    assert sum(sum(r.values()) for r in agree["confusion"].values()) == n_train


def test_annotate_with_every_reply_unusable_exits_nonzero_and_a_rerun_asks_again(tmp_path, capsys):
    """Every reply fails validation: the agreement leaves the native fallbacks out (no 100%), the
    command exits 1 in one line, nothing is saved or cached; the same server fixed answers the rerun."""
    from memgym.llm.server import serve_backend
    from tests.data_synth.fake_annotator import rule_reply
    from tests.helpers import ScriptedBackend

    fixed = {"now": False}
    server, _, url = serve_backend(ScriptedBackend(lambda m, p: rule_reply(m) if fixed["now"] else
                                                   "I cannot label this question.", model_id="a"),
                                   served_model_name="a")
    out, cache = tmp_path / "labels.jsonl", tmp_path / "cache.sqlite"
    args = ["annotate", "--dataset", "locomo", "--split", "train", "--annotator", f"openai:{url}#a", "--out", str(out),
            "--cache", str(cache), "--max_questions", "3", "--max_retries", "1"]
    try:
        assert main(args) == 1
        printed, err = capsys.readouterr()
        assert err.splitlines()[-1] == (
            "memgym annotate: 6 of 6 questions got no valid annotator label (every reply failed validation, e.g. no JSON "
            f"object in the reply 'I cannot label this question.'); they are not saved in {out} and a rerun asks them "
            "again: is --annotator a working model?")
        assert "| **all** | | **0** | **0** | **-** |" in printed and "100.00%" not in printed
        assert "asked again by a rerun): 6." in printed
        agree = json.loads((tmp_path / "labels.train.agreement.json").read_text())
        assert (agree["n"], agree["fallbacks"], agree["primary_match_rate"]) == (0, 6, None)
        assert out.read_text() == "" and server.requests_total == 12  # 6 questions x (1 + 1 retry)
        fixed["now"] = True  # same URL and model: same cache keys
        assert main(args) == 0
        assert server.requests_total == 18  # every question asked again, none answered from the cache
        labels = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(labels) == 6 and {x["source"] for x in labels} == {"annotator"}
        assert "| **all** | | **6** |" in capsys.readouterr().out
    finally:
        server.shutdown()
        server.server_close()
