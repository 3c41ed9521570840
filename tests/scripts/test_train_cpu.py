"""scripts/train_cpu.py: the program table of the CPU training report."""
from __future__ import annotations

import json

from scripts.train_cpu import program_table


def _report(path, extractor, mode, units, segments, failed, overall, caps, **cfg):
    path.mkdir(parents=True)
    path.joinpath("report.json").write_text(json.dumps({
        "program": "runs/demo_evolve/best.py", "conversations": ["conv-41", "conv-42"], "n": 11, "overall": overall,
        "by_capability": {c: {"score": v, "n": 1} for c, v in caps.items()},
        "extraction": {"mode": mode, "units": units, "segments": segments, "failed_manager_outputs": failed},
        "config": {"extractor": extractor, "n_sessions": 1, "plan_mode": "question", "scorer": "answer-recall",
                   "context_tokens": 1024, **cfg}}))


def test_program_table_rows_and_failed_outputs(tmp_path):
    assert program_table(tmp_path) == []
    _report(tmp_path / "program" / "turns", "turns", "turns", 38, 2, 0, 0.609, {"F": 0.808, "A": 0.375})
    _report(tmp_path / "program" / "sft", "hf:runs/train_cpu/sft", "extractor", 9, 8, 3, 0.25, {"F": 0.5},
            extractor_segment_tokens=200, extractor_max_new_tokens=640)
    lines = program_table(tmp_path)
    assert "segments of 200 tokens, 640 tokens per output" in lines[3]  # from the model-extractor report
    assert lines[-2] == "| turns (`turns`) | 0.609 | 0.808 | - | - | - | 0.375 | 38 | - | 2 |"
    # 8 segments x 4 managers = 32 manager outputs, 3 of them failed
    assert lines[-1] == "| sft (`hf:runs/train_cpu/sft`) | 0.250 | 0.500 | - | - | - | - | 9 | 3 / 32 | 8 |"
