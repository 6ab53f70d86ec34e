"""A collection run's summary as the Prefect UI shows it: a markdown report and a table.

Formats only: the numbers come from `storage.run_reads.summarize_run` (through the
collection, `Collection.summary`); `flows.collect.publish_summary` publishes them.
"""

from __future__ import annotations

from typing import Any

from storage.run_reads import RunSummary


def summary_markdown(run_key: str, summary: RunSummary) -> str:
    """The summary as a markdown report (the Prefect markdown artifact)."""
    lines = [
        f"# Collection run `{run_key}`",
        "",
        f"**{summary.episodes} episodes**, {summary.steps} steps, success rate "
        f"**{summary.success_rate:.1%}**; median {summary.median_steps} steps, "
        f"median duration {summary.median_duration_s or 0:.2f} s.",
        "",
        "| status | episodes |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in summary.by_status.items()),
        "",
        "| failure category | episodes |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in summary.by_failure_category.items()),
        "",
        "| template | success rate |",
        "|---|---|",
        *(f"| {k} | {v:.1%} |" for k, v in summary.success_rate_by_template.items()),
        "",
        "| tool | calls | failure rate |",
        "|---|---|---|",
        *(
            f"| {k} | {summary.tool_calls.get(k, 0)} | {v:.1%} |"
            for k, v in summary.tool_failure_rate.items()
        ),
    ]
    return "\n".join(lines) + "\n"


def summary_table(summary: RunSummary) -> list[dict[str, Any]]:
    """One row per template (the Prefect table artifact)."""
    return [
        {"template": template, "success_rate": rate}
        for template, rate in summary.success_rate_by_template.items()
    ]
