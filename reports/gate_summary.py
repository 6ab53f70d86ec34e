"""The qc-gate's markdown artifact: the gate's report (`expectations.report.render_markdown`),
then what the gate decided about training.

Formats only: the flow (`flows/qc.py`) hands over the numbers and the training's link;
`flows.qc.qc_gate` publishes the result.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from expectations.report import GateReport, render_markdown


def gate_markdown(
    report: GateReport,
    *,
    volume: float,
    threshold: float,
    training_link: str | None,
    training_deployment: str | None,
    training_qc_runs: Sequence[uuid.UUID],
    grm_unscored: int,
) -> str:
    """The gate's artifact: the report, the trigger decision, a link to the training.

    `volume`, `threshold`: the quality-weighted volume since the last training and the
    volume that triggers one; `training_link`: a markdown link to the training this gate
    started (None: it started none), `training_deployment` the deployment it runs;
    `training_qc_runs`: the gate runs it draws on; `grm_unscored`: episodes the LLM judge
    could not score.
    """
    fired = "no"
    if training_link is not None:
        fired = f"yes, {training_link}"
        if training_deployment:
            fired += f" (deployment `{training_deployment}`)"
    unscored = (
        f"\n\nLLM judge: {grm_unscored} episode(s) unscored (the rule judge stands)."
        if grm_unscored
        else ""
    )
    return (
        render_markdown(report)
        + unscored
        + f"\n\nQuality-weighted volume since the last training: "
        f"**{volume:.1f}** "
        f"(threshold {threshold:.1f}); training triggered: **{fired}**.\n"
        + (
            f"\nThe training draws on {len(training_qc_runs)} gate run(s): "
            + ", ".join(f"`{q}`" for q in training_qc_runs)
            + ".\n"
            if training_qc_runs
            else ""
        )
    )
