"""A damaged run directory never ends in a traceback: a small offline run is killed (kill -9)
during round 3's evaluation; then, for EACH file of its run directory in turn, a copy with that
file deleted, and one with it cut to half its bytes (a torn write), is resumed. Every case
either ends in one stderr line and exit status 2 naming the file, or resumes to the end state
of the undamaged run (archive fingerprint, summary scores)."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from memgym.evolution.search.journal import load_archive

ROOT = Path(__file__).resolve().parents[3]
RECIPE = ["dataset: locomo", "train: [conv-26]", "valid: [conv-30]", "n_sessions: 2", "max_questions: 6",
          "extractor: turns", "plan_mode: question", "scorer: answer-recall", "proposer: params", "rounds_cold: 1",
          "rounds_refine: 2", "rounds_integrate: 0", "seed: 1", "probe_units: 200", "probe_batches: 10",
          "embedder: hash:256", "baselines: []", "progress: false"]


def _end_state(run: Path):
    s = json.loads((run / "summary.json").read_text())
    arch = load_archive(run)
    return arch.fingerprint(), s["final_id"], s["final"]["valid"], s["rounds"], s["candidates_evaluated"]


def _resume(run: Path, capsys) -> tuple[int, list[str]]:
    from memgym.launch.cli import main

    capsys.readouterr()
    rc = main(["evolve", "--resume", str(run), "--no_progress"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("warning:")]
    return rc, err


def test_every_deleted_or_torn_file_of_a_killed_run_resumes_or_is_named_in_one_line(tmp_path, capsys, monkeypatch):
    import memgym.evolution.search.report as report

    monkeypatch.setattr(report, "save_figure", lambda fig, path: None)  # the plots are half a resume's time here
    recipe = tmp_path / "r.yaml"
    recipe.write_text("\n".join(RECIPE) + "\n")
    killed = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "tests.faults", "evaluation:3", "evolve", "--recipe", str(recipe),
                           "--out", str(killed)], env=env, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert proc.returncode == -9, proc.stderr[-2000:]
    assert (killed / "candidates/r03/validation.json").exists() and not (killed / "candidates/r03/eval.json").exists()
    ref = tmp_path / "ref"
    shutil.copytree(killed, ref)
    assert _resume(ref, capsys) == (0, [])
    want = _end_state(ref)
    files = sorted(p.relative_to(killed).as_posix() for p in killed.rglob("*") if p.is_file() and p.name != ".lock")
    assert {"recipe.json", "state.json", "seed.py", "candidates/r02/eval.json", "candidates/r03/proposal.json",
            "stages.sqlite", "stages.sqlite-wal"} <= set(files)
    bad, got = [], {}
    for i, rel in enumerate(files):
        for how in ("deleted", "torn"):
            case = tmp_path / f"c{i}{how[0]}"
            shutil.copytree(killed, case)
            if not rel.startswith("stages.sqlite"):  # the undamaged resume's stage cache: round 3 runs from it
                for p in case.glob("stages.sqlite*"):
                    p.unlink()
                for name in ("stages.sqlite", "stages.sqlite-wal"):
                    if (ref / name).exists():
                        shutil.copy(ref / name, case / name)
            target = case / rel
            if how == "deleted":
                target.unlink()
            else:
                data = target.read_bytes()
                target.write_bytes(data[:len(data) // 2])
            try:
                rc, err = _resume(case, capsys)
            except BaseException as e:  # noqa: BLE001 - a traceback is the failure under test
                bad.append(f"{rel} {how}: raised {type(e).__name__}: {e}")
                continue
            if rc == 2 and len(err) == 1 and Path(rel).name in err[0] and err[0].startswith("memgym evolve: "):
                got[rel, how] = "named"
            elif rc == 0 and _end_state(case) == want:
                got[rel, how] = "resumed"
            else:
                bad.append(f"{rel} {how}: exit {rc}, stderr {err[-3:]}")
            shutil.rmtree(case)
    assert not bad, "\n".join(bad)
    assert len(got) == 2 * len(files)
    # the finished rounds' records and programs are needed; the interrupted round's and the caches are redone
    for rel in ("candidates/r02/eval.json", "candidates/seed/eval.json", "candidates/r01/program.py", "recipe.json"):
        assert got[rel, "deleted"] == got[rel, "torn"] == "named", rel
    for rel in ("state.json", "seed.py", "candidates/r03/validation.json", "stages.sqlite", "responses.sqlite"):
        assert got[rel, "deleted"] == "resumed", rel
