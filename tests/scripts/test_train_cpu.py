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


def test_report_heldout_row_has_the_core_copy_rate(tmp_path):
    """A held-out measurement -> its report row, with the core copy rate of its stored outputs
    (an APPEND of turn D1:1 of conv-26, 11/11 words copied, and a novel one, 0/7: mean 0.50 over 2)."""
    from scripts.train_cpu import main

    append = '{{"operation": "APPEND", "content": "{}"}}'.format
    outputs = {"conv-26": [{"core": append("Caroline: Hey Mel! Good to see you! How have you been?"),
                            "episodic": '{"operations": []}'},
                           {"core": append("Caroline is a transgender woman who paints.")}]}
    rate = {"core": 0.0, "episodic": 0.0, "semantic": None, "procedural": None}
    (tmp_path / "measure").mkdir()
    (tmp_path / "measure" / "sft.json").write_text(json.dumps({"label": "sft", "spec": "hf:x", "heldout": {
        "format_failure_rate": rate, "format_failure_overall": 0.0, "bank": {"conv-26": {"core_chars": 90}},
        "bank_entries": 0, "answer_recall": 0.25, "f1": 0.1, "n_qa": 4, "segment_tokens": 200, "sessions": 1,
        "outputs": outputs}}))
    assert main(["report", "--out", str(tmp_path), "--table", "sft"]) == 0
    text = (tmp_path / "report.md").read_text()
    assert ("| sft, segments of 200 (`hf:x`) | 0.00 | 0.00 | - | - | 0.00 | 0 | 90 | 0.50 (2) | 0.250 | 0.100 | 4 |"
            in text)
    assert (tmp_path / "curves.png").is_file()
