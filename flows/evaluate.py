"""The `evaluate` flow: a checkpoint as an `hf:` policy on held-out tasks in real sandboxes.

Stages as Prefect tasks: `evaluation-episodes` (one per checkpoint: the model fetched, one
episode per held-out task, run as the collection `eval-<checkpoint>` through
`collection.evaluation`: the run key's lock, the run row written and ended by the
collection, never left `running`; a re-run resumes it), `evaluation-metrics` (completion
rate, average steps, tool-call failure rate) and `compare-checkpoints` (against the
previous checkpoint on the same tasks, recorded on the checkpoint row). A markdown artifact
shows the comparison.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from prefect import flow, get_run_logger, task
from prefect.artifacts import acreate_markdown_artifact
from prefect.cache_policies import NONE
from prefect.runtime import flow_run
from pydantic import BaseModel, ConfigDict, Field

from agent.trajectory import Trajectory
from config.settings import Settings, load_settings
from core.scratch import scratch_dir
from flows import route_library_logs
from tasks.types import TaskInstance
from training.evaluation import EvaluationMetrics

METRICS = ("completion_rate", "avg_steps", "tool_failure_rate")


class EvaluationOptions(BaseModel):
    """What an evaluation runs: held-out instances, templates, and how long a model may act."""

    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    instances: int = Field(default=2, ge=0)
    """Held-out instances per template (never trained on); 0 skips the evaluation."""
    templates: list[str] | None = None
    """Restrict to these templates (default: every template of the suite)."""
    suite: str = "builtin"
    """Suite the held-out tasks come from."""
    max_steps: int = Field(default=8, ge=1)
    """Assistant turns per episode."""
    max_new_tokens: int = Field(default=256, ge=1)
    """Tokens the model may generate per turn."""


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
    flow_run_id: str | None = None
    """The evaluate flow run (for links in the UI)."""


@task(name="evaluation-episodes", cache_policy=NONE, retries=0)
async def evaluation_episodes(
    settings: Settings,
    checkpoint_id: uuid.UUID,
    tasks: list[TaskInstance],
    options: EvaluationOptions,
) -> list[Trajectory]:
    """Run checkpoint `checkpoint_id` on `tasks` and store the episodes: the collection
    run `eval-<id>` (`collection.evaluation.run_evaluation`: the run key's lock, the run
    row written and ended by the collection, the warm pool, the outbox)."""
    from collection.evaluation import evaluation_settings, run_model_evaluation
    from storage.db import make_engine
    from storage.objects import make_object_store
    from training.registry import fetch_checkpoint, link_policy_to_checkpoint

    started = time.monotonic()
    spec = f"hf:checkpoint/{checkpoint_id}"
    engine = make_engine(settings.database)
    store = make_object_store(settings.objects)
    try:
        with scratch_dir("epiflow-eval-") as tmp:
            model_dir = await asyncio.to_thread(
                fetch_checkpoint, engine, store, checkpoint_id, tmp / "model"
            )
            labelled = await run_model_evaluation(
                model_dir,
                tasks,
                run_key=f"eval-{checkpoint_id}",
                suite=options.suite,
                settings=evaluation_settings(settings, max_steps=options.max_steps),
                max_new_tokens=options.max_new_tokens,
                spec=spec,
                engine=engine,
                store=store,
                flow_run_id=str(flow_run.id) if flow_run.id else None,
            )
        await asyncio.to_thread(link_policy_to_checkpoint, engine, spec, checkpoint_id)
    finally:
        engine.dispose()
    get_run_logger().info(
        "evaluation-episodes: checkpoint %s, %d episodes in %.1f s",
        checkpoint_id,
        len(labelled),
        time.monotonic() - started,
    )
    return labelled


@task(name="evaluation-metrics", cache_policy=NONE)
def evaluation_metrics_task(trajectories: list[Trajectory]) -> EvaluationMetrics:
    """Completion rate, average steps and tool-call failure rate of the episodes."""
    from training.evaluation import evaluation_metrics

    metrics = evaluation_metrics(trajectories)
    get_run_logger().info(
        "evaluation-metrics: completion %.3f, avg steps %.2f, tool failures %.3f (%d episodes)",
        metrics.completion_rate,
        metrics.avg_steps,
        metrics.tool_failure_rate,
        metrics.n_episodes,
    )
    return metrics


@task(name="compare-checkpoints", cache_policy=NONE, retries=2, retry_delay_seconds=2)
async def compare_checkpoints(
    settings: Settings,
    checkpoint_id: uuid.UUID,
    metrics: EvaluationMetrics,
    previous_id: uuid.UUID | None,
    previous_metrics: EvaluationMetrics | None,
    heldout_tasks: int,
) -> EvaluationResult:
    """This checkpoint against the previous one; the result recorded on the checkpoint row."""
    from storage.db import make_engine
    from training.evaluation import compare_metrics
    from training.registry import record_evaluation

    result = EvaluationResult(
        checkpoint_id=checkpoint_id,
        completion_rate=metrics.completion_rate,
        avg_steps=metrics.avg_steps,
        tool_failure_rate=metrics.tool_failure_rate,
        n_episodes=metrics.n_episodes,
        previous_checkpoint_id=previous_id,
        previous=(
            {name: getattr(previous_metrics, name) for name in METRICS}
            if previous_metrics
            else None
        ),
        delta=compare_metrics(metrics, previous_metrics),
        heldout_tasks=heldout_tasks,
        flow_run_id=str(flow_run.id) if flow_run.id else None,
    )
    engine = make_engine(settings.database)
    try:
        await asyncio.to_thread(
            record_evaluation, engine, checkpoint_id, result.model_dump(mode="json")
        )
    finally:
        engine.dispose()
    get_run_logger().info(
        "compare-checkpoints: %s vs %s: %s",
        checkpoint_id,
        previous_id or "nothing",
        ", ".join(f"{k} {v:+.3f}" for k, v in result.delta.items()) or "no previous checkpoint",
    )
    return result


def comparison_markdown(result: EvaluationResult) -> str:
    """The evaluation as a markdown table: this checkpoint, the previous one, the delta."""
    previous = f"`{result.previous_checkpoint_id}`" if result.previous_checkpoint_id else "none"
    lines = [
        f"# Evaluation of checkpoint `{result.checkpoint_id}`",
        "",
        f"{result.n_episodes} episodes on {result.heldout_tasks} held-out tasks; "
        f"compared with {previous}.",
        "",
        "| metric | this checkpoint | previous | delta |",
        "|---|---|---|---|",
    ]
    for name in METRICS:
        before = result.previous.get(name) if result.previous else None
        delta = result.delta.get(name)
        lines.append(
            f"| {name} | {getattr(result, name):.3f} | "
            f"{'' if before is None else f'{before:.3f}'} | "
            f"{'' if delta is None else f'{delta:+.3f}'} |"
        )
    return "\n".join(lines) + "\n"


@flow(
    name="evaluate",
    flow_run_name="evaluate-{checkpoint}",
    log_prints=False,
    persist_result=False,
)
async def evaluate(
    checkpoint: str,
    instances: int = 2,
    suite: str = "builtin",
    templates: list[str] | None = None,
    max_steps: int = 8,
    max_new_tokens: int = 256,
    compare_previous: bool = True,
) -> EvaluationResult:
    """Evaluate `checkpoint` on held-out instances (never trained on), against the previous
    checkpoint on the same tasks.

    Args:
        checkpoint: Id of the checkpoint to evaluate.
        instances: Held-out instances per template.
        suite: Suite the held-out tasks come from.
        templates: Restrict to these templates (default: every template of the suite).
        max_steps: Assistant turns per episode.
        max_new_tokens: Tokens the model may generate per turn.
        compare_previous: Also run the previous checkpoint (its parent, else the newest
            older one) on the same tasks and show the difference.
    """
    from storage.db import make_engine
    from suites.registry import load_suite
    from training.registry import previous_checkpoint

    route_library_logs()
    options = EvaluationOptions(
        instances=instances,
        templates=templates,
        suite=suite,
        max_steps=max_steps,
        max_new_tokens=max_new_tokens,
    )
    settings = load_settings()
    checkpoint_id = uuid.UUID(checkpoint)
    tasks = load_suite(suite, settings=settings.suites).heldout_instances(
        instances, templates=templates
    )
    engine = make_engine(settings.database)
    try:
        prev = previous_checkpoint(engine, checkpoint_id) if compare_previous else None
    finally:
        engine.dispose()
    episodes = await evaluation_episodes(settings, checkpoint_id, tasks, options)
    metrics = evaluation_metrics_task(episodes)
    previous_metrics = None
    if prev is not None:
        previous_episodes = await evaluation_episodes(settings, prev, tasks, options)
        previous_metrics = evaluation_metrics_task(previous_episodes)
    result = await compare_checkpoints(
        settings, checkpoint_id, metrics, prev, previous_metrics, len(tasks)
    )
    await acreate_markdown_artifact(
        markdown=comparison_markdown(result),
        key=f"eval-{str(checkpoint_id)[:8]}",
        description="Evaluation: this checkpoint against the previous one",
    )
    return result
