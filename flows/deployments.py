"""The deployments operators see in the Prefect UI, served by `epiflow serve`.

The same four (plus the shard deployment used for scale-out) are declared in
`prefect.yaml` for the `prefect deploy` + work pool route.
"""

from __future__ import annotations

from typing import Any

from prefect.schedules import Cron

NIGHTLY_CRON = "0 2 * * *"
"""02:00 UTC every night."""

NIGHTLY_PARAMETERS: dict[str, Any] = {
    "request": {
        "suite": "builtin",
        "policy": "scripted:noisy",
        "tasks": 4,
        "rollouts": 2,
        "concurrency": 8,
        "faults": "light",
    },
    "gate": True,
}
"""What the nightly collection runs; override per run in the UI."""


def runner_deployments() -> list[Any]:
    """`RunnerDeployment`s for `prefect.serve` (one process, no work pool)."""
    from flows.collect import collect_episodes
    from flows.evaluate import evaluate
    from flows.qc import qc_gate
    from flows.shard import collect_shard
    from flows.train import train

    return [
        collect_episodes.to_deployment(
            name="nightly-collect",
            schedules=[Cron(NIGHTLY_CRON, timezone="UTC")],
            parameters=NIGHTLY_PARAMETERS,
            description="Nightly episode collection on the built-in suite, then the QC gate.",
            tags=["epiflow", "collect"],
        ),
        collect_shard.to_deployment(
            name="shard",
            description="One shard of a collection run (scale-out).",
            tags=["epiflow", "collect"],
        ),
        qc_gate.to_deployment(
            name="qc-gate", description="Quality gate of a collection run.", tags=["epiflow", "qc"]
        ),
        train.to_deployment(
            name="train",
            description="Dataset snapshot → TRL trainer → checkpoint.",
            tags=["epiflow", "train"],
        ),
        evaluate.to_deployment(
            name="evaluate",
            description="A checkpoint as a policy on held-out tasks.",
            tags=["epiflow", "evaluate"],
        ),
    ]
