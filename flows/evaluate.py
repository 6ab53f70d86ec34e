"""The `evaluate` flow: a checkpoint as an `hf:` policy on held-out tasks in real sandboxes.

Completion rate, average steps and tool-call failure rate, compared with the previous
checkpoint on the same tasks; the episodes are stored like any other (run key
`eval-<checkpoint>`, closed when stored), the numbers on the checkpoint row and in a
Prefect artifact.
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path

from prefect import flow
from prefect.artifacts import acreate_markdown_artifact
from pydantic import BaseModel, Field

from config.settings import load_settings


class EvaluationResult(BaseModel):
    """A checkpoint's evaluation (the CLI's JSON, the flow's result)."""

    checkpoint_id: uuid.UUID
    """The checkpoint evaluated."""
    completion_rate: float
    """Episodes the verifier confirmed / episodes."""
    avg_steps: float
    """Mean assistant turns per episode."""
    tool_failure_rate: float
    """Acting turns that failed / acting turns."""
    n_episodes: int
    """Episodes run."""
    previous_checkpoint_id: uuid.UUID | None = None
    """The checkpoint it is compared with, if any."""
    previous: dict[str, float] | None = None
    """That checkpoint's three metrics on the same tasks."""
    delta: dict[str, float] = Field(default_factory=dict)
    """This minus previous, per metric."""
    heldout_tasks: int = 0
    """Held-out task instances evaluated."""


@flow(name="evaluate", log_prints=True, persist_result=True)
async def evaluate(
    checkpoint: str,
    instances: int = 2,
    suite: str = "builtin",
    templates: list[str] | None = None,
    max_steps: int = 8,
    max_new_tokens: int = 256,
    compare_previous: bool = True,
) -> EvaluationResult:
    """Evaluate `checkpoint` on `instances` held-out instances per template (never trained on)."""
    from agent.trajectory import Trajectory
    from models import run_id_for
    from storage.db import make_engine
    from storage.episodes import persist_episodes
    from storage.migrate import ensure_current
    from storage.objects import make_object_store
    from storage.runs import close_run
    from suites.registry import load_suite
    from training.evaluation import (
        EvaluationMetrics,
        compare_metrics,
        evaluation_metrics,
        run_model_episodes,
    )
    from training.registry import (
        fetch_checkpoint,
        link_policy_to_checkpoint,
        previous_checkpoint,
        record_evaluation,
    )

    settings = load_settings()
    engine = make_engine(settings.database)
    try:
        ensure_current(engine)
        store = make_object_store(settings.objects)
        checkpoint_id = uuid.UUID(checkpoint)
        tasks = load_suite(suite, settings=settings.suites).heldout_instances(
            instances, templates=templates
        )

        async def measure(cid: uuid.UUID) -> EvaluationMetrics:
            spec = f"hf:checkpoint/{cid}"
            run_key = f"eval-{cid}"
            with tempfile.TemporaryDirectory(prefix="epiflow-eval-") as tmp:
                model_dir = fetch_checkpoint(engine, store, cid, Path(tmp) / "model")
                trajectories: list[Trajectory] = await run_model_episodes(
                    model_dir,
                    tasks,
                    run_key=run_key,
                    max_steps=max_steps,
                    max_new_tokens=max_new_tokens,
                )
            labelled = [t.model_copy(update={"policy": spec}) for t in trajectories]
            persist_episodes(engine, store, labelled)
            close_run(engine, run_id_for(run_key), status="completed")
            link_policy_to_checkpoint(engine, spec, cid)
            return evaluation_metrics(trajectories)

        metrics = await measure(checkpoint_id)
        prev = previous_checkpoint(engine, checkpoint_id) if compare_previous else None
        previous_metrics = await measure(prev) if prev is not None else None
        result = EvaluationResult(
            checkpoint_id=checkpoint_id,
            completion_rate=metrics.completion_rate,
            avg_steps=metrics.avg_steps,
            tool_failure_rate=metrics.tool_failure_rate,
            n_episodes=metrics.n_episodes,
            previous_checkpoint_id=prev,
            previous=(
                {
                    name: getattr(previous_metrics, name)
                    for name in ("completion_rate", "avg_steps", "tool_failure_rate")
                }
                if previous_metrics
                else None
            ),
            delta=compare_metrics(metrics, previous_metrics),
            heldout_tasks=len(tasks),
        )
        record_evaluation(engine, checkpoint_id, result.model_dump(mode="json"))
    finally:
        engine.dispose()
    lines = [
        f"# Evaluation of checkpoint `{checkpoint_id}`",
        "",
        "| metric | this checkpoint | previous | delta |",
        "|---|---|---|---|",
    ]
    for name in ("completion_rate", "avg_steps", "tool_failure_rate"):
        before = result.previous.get(name) if result.previous else None
        lines.append(
            f"| {name} | {getattr(result, name):.3f} | {'' if before is None else f'{before:.3f}'} "
            f"| {result.delta.get(name, '')} |"
        )
    await acreate_markdown_artifact(
        markdown="\n".join(lines) + "\n",
        key=f"eval-{str(checkpoint_id)[:8]}",
        description="Evaluation",
    )
    return result
