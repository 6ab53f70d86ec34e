"""The `evaluate` flow: a checkpoint as an `hf:` policy on held-out tasks in real sandboxes.

Completion rate, average steps and tool-call failure rate, compared with the previous
checkpoint on the same tasks; the episodes are stored like any other (run key
`eval-<checkpoint>`), the numbers on the checkpoint row and in a Prefect artifact.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

from prefect import flow
from prefect.artifacts import acreate_markdown_artifact
from sqlalchemy import update
from sqlmodel import col

from agent.trajectory import Trajectory
from config.settings import load_settings
from models import Policy
from storage.db import make_engine
from storage.episodes import persist_episodes
from storage.migrate import ensure_current
from storage.objects import make_object_store
from suites.registry import load_suite
from training.evaluation import (
    EvaluationMetrics,
    compare_metrics,
    evaluation_metrics,
    run_model_episodes,
)
from training.registry import fetch_checkpoint, previous_checkpoint, record_evaluation


def _labelled(trajectories: list[Trajectory], spec: str) -> list[Trajectory]:
    return [t.model_copy(update={"policy": spec}) for t in trajectories]


@flow(name="evaluate", log_prints=True, persist_result=True)
async def evaluate(
    checkpoint: str,
    instances: int = 2,
    suite: str = "builtin",
    templates: list[str] | None = None,
    max_steps: int = 8,
    max_new_tokens: int = 256,
    compare_previous: bool = True,
) -> dict[str, Any]:
    """Evaluate `checkpoint` on `instances` held-out instances per template (never trained on)."""
    settings = load_settings()
    engine = make_engine(settings.database)
    ensure_current(engine)
    store = make_object_store(settings.objects)
    checkpoint_id = uuid.UUID(checkpoint)
    tasks = load_suite(suite).heldout_instances(instances, templates=templates)
    spec = f"hf:checkpoint/{checkpoint_id}"

    async def measure(cid: uuid.UUID, label: str) -> EvaluationMetrics:
        with tempfile.TemporaryDirectory(prefix="epiflow-eval-") as tmp:
            model_dir = fetch_checkpoint(engine, store, cid, Path(tmp) / "model")
            run_key = f"eval-{cid}"
            trajectories = await run_model_episodes(
                model_dir,
                tasks,
                run_key=run_key,
                max_steps=max_steps,
                max_new_tokens=max_new_tokens,
            )
        persist_episodes(engine, store, _labelled(trajectories, label))
        with engine.begin() as conn:
            conn.execute(
                update(Policy).where(col(Policy.id) == label).values(kind="hf", checkpoint_id=cid)
            )
        return evaluation_metrics(trajectories)

    metrics = await measure(checkpoint_id, spec)
    previous_metrics = None
    prev = previous_checkpoint(engine, checkpoint_id) if compare_previous else None
    if prev is not None:
        previous_metrics = await measure(prev, f"hf:checkpoint/{prev}")
    delta = compare_metrics(metrics, previous_metrics)
    result: dict[str, Any] = {
        "checkpoint_id": str(checkpoint_id),
        **metrics.model_dump(),
        "previous_checkpoint_id": str(prev) if prev else None,
        "previous": previous_metrics.model_dump() if previous_metrics else None,
        "delta": delta,
        "heldout_tasks": len(tasks),
    }
    record_evaluation(engine, checkpoint_id, result)
    lines = [
        f"# Evaluation of checkpoint `{checkpoint_id}`",
        "",
        "| metric | this checkpoint | previous | delta |",
        "|---|---|---|---|",
    ]
    for name in ("completion_rate", "avg_steps", "tool_failure_rate"):
        before = getattr(previous_metrics, name) if previous_metrics else None
        lines.append(
            f"| {name} | {getattr(metrics, name):.3f} | {'' if before is None else f'{before:.3f}'} | {delta.get(name, '')} |"
        )
    await acreate_markdown_artifact(
        markdown="\n".join(lines) + "\n",
        key=f"eval-{str(checkpoint_id)[:8]}",
        description="Evaluation",
    )
    engine.dispose()
    return result
