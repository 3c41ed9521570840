"""README.md's "Evolution from Python" example runs as written (in a temporary folder) and
prints what it promises: one outcome line per attempt, the frozen program and its scores."""
from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _example() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    section = text.split("### Evolution from Python", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_python_example_runs_an_offline_evolution_with_a_callback(tmp_path, monkeypatch, capsys):
    code = _example()
    assert 10 <= len(code.strip().splitlines()) <= 15
    monkeypatch.chdir(tmp_path)
    exec(compile(code, "README.md", "exec"), {"__name__": "readme_example"})
    lines = capsys.readouterr().out.strip().splitlines()
    run = tmp_path / "runs" / "evolve_py"
    summary = json.loads((run / "summary.json").read_text())
    state = json.loads((run / "state.json").read_text())
    # one outcome line per attempt: the seed and 3 rounds, as booked in the history
    outcomes = [x for x in lines if x.startswith("round ")]
    assert [x.split(":")[0] for x in outcomes] == ["round 0", "round 1", "round 2", "round 3"]
    assert outcomes[0] == "round 0: seed evaluated, base + all specialists"
    status = {c["id"]: c["status"] for c in state["archive"]["candidates"]}
    for line, row in zip(outcomes[1:], state["history"][1:]):
        assert line == f"round {row['round']}: {row['candidate']} {status[row['candidate']]}, {row['accepted']}"
    assert lines[-2] == f"{summary['final_id']} - {summary['frozen']['why']}"
    assert lines[-1] == (f"valid {summary['final']['valid']['by_capability']} test {summary['final']['test']['overall']} "
                         "report runs/evolve_py/report.md")
    assert (run / "report.md").exists() and (run / "best.py").exists()
