"""The monitor flow's markdown artifact (`monitor-<alias>`): the verdict, the rollback,
and every check of the monitor suite with the window's figure, the baseline and the bound.

Formats only: `flows.monitor.monitor` hands over the verdict and publishes the result.
"""

from __future__ import annotations

from training.monitor import MonitorVerdict

__all__ = ["monitor_markdown"]


def monitor_markdown(verdict: MonitorVerdict, source: str) -> str:
    """The `monitor-<alias>` artifact: the verdict and every check."""
    rows = [
        "| check | status | window | baseline | bound |",
        "|---|---|---|---|---|",
    ]
    for c in verdict.report.checks if verdict.report else []:
        bound = (
            f">= {c.min_value:.3f}"
            if c.min_value is not None
            else (f"<= {c.max_value:.3f}" if c.max_value is not None else c.note)
        )
        rows.append(
            f"| `{c.expectation}` | {c.status} | "
            f"{'-' if c.observed is None else f'{c.observed:.3f}'} | "
            f"{'-' if c.baseline is None else f'{c.baseline:.3f}'} | {bound} |"
        )
    head = [
        f"# Monitor: {verdict.alias} (checkpoint {verdict.checkpoint_id})",
        "",
        f"Window: {source}.",
        "",
        f"**{'BREACH' if verdict.breach else 'No breach'}**: {verdict.reason}",
    ]
    if verdict.rolled_back_to:
        head += ["", f"Rolled back: `{verdict.alias}` now points at `{verdict.rolled_back_to}`."]
    return "\n".join([*head, "", *rows, ""])
