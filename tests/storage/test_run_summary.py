"""Run summaries over many rows: column types come from all rows, not the first hundred."""

from __future__ import annotations

import polars as pl

from storage.run_reads import _frame, summarize_frames


def test_late_non_null_values_do_not_break_the_summary() -> None:
    # 150 clean calls, then failures: a type inferred from the first rows alone would be Null.
    calls = [("read_file", 1, 0)] * 150 + [("execute_shell", 1, 1)] * 10
    episodes = [("e", "t", "success", "success", 3, None)] * 120 + [
        ("f", "t", "failed", "verifier_failed", 5, 12.5)
    ]
    summary = summarize_frames(
        _frame(
            episodes, ["id", "template", "status", "failure_category", "n_steps", "duration_ms"]
        ),
        _frame(calls, ["tool", "calls", "failed"]),
    )
    assert summary.tool_failure_rate == {"execute_shell": 1.0, "read_file": 0.0}
    assert summary.tool_calls == {"execute_shell": 10, "read_file": 150}
    assert summary.episodes == 121 and summary.median_duration_s == 0.0125
    assert isinstance(_frame([], ["a"]), pl.DataFrame)
