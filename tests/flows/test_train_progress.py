"""The train flow's progress under Prefect's test harness: for agentic GRPO the progress
artifact is updated at every optimiser step (not at most once a second), its description
carrying the step's reward mean and std, success rate, KL, grad norm, groups dropped by
why, the step's rollout tokens and tokens/s; the loss table has the same figures per
step, and the process's memory. The metrics hook is fed from a worker thread, as the trainer calls it."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from typing import Any

from prefect import flow
from prefect.artifacts import acreate_progress_artifact
from prefect.client.orchestration import get_client

from flows.train import _TrainingMonitor


def _logs(step: int) -> dict[str, float]:
    """TRL's log event of GRPO step `step` (what `training.callbacks.MetricsLogger` passes)."""
    return {
        "loss": 0.5 / step,
        "grad_norm": 1.5,
        "learning_rate": 2e-6,
        "reward": step / 10,
        "reward_std": 0.4,
        "kl": step / 50,
        "num_tokens": 1000.0 * step,
        "grpo/success_rate": 0.5,
        "grpo/groups_used": 1.0,
        "grpo/groups_dropped_zero_variance": 1.0,
        "grpo/groups_dropped_infrastructure": float(step - 1),
        "grpo/groups_dropped_qc": 0.0,
        "grpo/rollout_tokens": 3000.0 * step,
        "memory/rss_gib": 4.0 + step / 10,
        "memory/freed_gib": 6.5,
        "memory/peak_gib": 10.5,
    }


async def _artifact(key: str) -> Any:
    async with get_client() as client:
        found = await client.read_artifacts()
    return max(
        (a for a in found if a.key == key),
        key=lambda a: a.created.timestamp() if a.created else 0.0,
    )


def test_grpo_progress_artifact_is_updated_at_every_optimiser_step(prefect_harness: None) -> None:
    key = f"train-progress-test-{uuid.uuid4().hex[:8]}"
    seen: list[tuple[float, str]] = []

    @flow(name="train-progress-test")
    async def monitored() -> None:
        progress = await acreate_progress_artifact(
            progress=0.0, key=key + "-progress", description="starting"
        )
        monitor = _TrainingMonitor(asyncio.get_running_loop(), progress, key=key + "-loss")
        for step in (1, 2, 3):  # within a second: only GRPO's per-step rule publishes step 2
            await asyncio.to_thread(monitor.on_metrics, step, 3, _logs(step))
            await monitor.drain()
            artifact = await _artifact(key + "-progress")
            seen.append((float(artifact.data), str(artifact.description)))
        await monitor.publish_table()

    asyncio.run(monitored())

    assert [round(value) for value, _ in seen] == [33, 67, 100]
    first, second, third = (description for _, description in seen)
    assert first == (
        "step 1 / 3: reward 0.1 ± 0.4, success 0.5, KL 0.02, grad norm 1.5, groups dropped "
        "1 zero-variance / 0 infrastructure / 0 gate, 3000 tokens, - tokens/s"  # no rate yet
    ), first
    assert second.startswith(
        "step 2 / 3: reward 0.2 ± 0.4, success 0.5, KL 0.04, grad norm 1.5, groups dropped "
        "1 zero-variance / 1 infrastructure / 0 gate, 6000 tokens, "
    ), second
    assert re.search(r", \d[\d.e+]* tokens/s$", second), second
    assert third.startswith("step 3 / 3: reward 0.3 ± 0.4"), third

    table = asyncio.run(_artifact(key + "-loss")).data
    rows = json.loads(table) if isinstance(table, str) else table
    assert [r["step"] for r in rows] == [1, 2, 3]
    assert rows[2]["dropped_infrastructure"] == 2 and rows[2]["dropped_zero_variance"] == 1
    assert rows[1]["success"] == 0.5 and rows[1]["kl"] == 0.04
    assert rows[0]["tokens/s"] is None and rows[1]["tokens/s"] > 0
    assert [r["tokens"] for r in rows] == [3000, 6000, 9000]
    assert [(r["rss_gib"], r["peak_gib"]) for r in rows] == [(4.1, 10.5), (4.2, 10.5), (4.3, 10.5)]
