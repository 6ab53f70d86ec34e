"""The `evaluate` flow: a checkpoint as an `hf:` policy on held-out tasks in real sandboxes.

Stages as Prefect tasks: `evaluation-episodes` (one per checkpoint: the model fetched, one
episode per held-out task, run as the collection `eval-<checkpoint>` through
`collection.evaluation`: the run key's lock, the run row written and ended by the
collection, never left `running`; a re-run resumes it), `evaluation-metrics` (completion
rate, average steps, tool-call failure rate) and `compare-checkpoints` (against the
previous checkpoint on the same tasks, recorded on the checkpoint row). A markdown artifact
shows the comparison.

With `promote_alias`, the comparison is the alias's champion (read once, before anything
runs; while the alias is unset, the base the checkpoint was trained from:
`training.champion.comparison_for`), and a `promote` stage follows the two evaluations:
the paired rule (`training.promotion`, thresholds as the `promotion` parameter) decides, the
alias moves when it says so (a `model_alias_change` row with the figures), and the
decision, promoted or kept, is stored with the checkpoint's evaluation, logged in one line
and shown as the markdown artifact `promotion-<alias>` (one version per decision).
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
from flows import artifact_key, route_library_logs
from tasks.types import TaskInstance
from training.champion import Comparison, PromotionOutcome
from training.evaluation import EvaluationMetrics
from training.promotion import PromotionRule

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
    promote_alias: str | None = None
    """Compare with this alias's champion and promote the checkpoint when the rule says
    so (e.g. `champion`); empty: compare with the previous checkpoint, promote nothing."""
    promotion: PromotionRule = PromotionRule()
    """The promotion rule's thresholds (margin, alpha, tolerances, fewest task pairs)."""


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
    """Episodes run (infrastructure outcomes left out)."""
    parse_error_rate: float | None = None
    """Turns that did not parse / turns (a baseline of the production monitor)."""
    n_infrastructure: int = 0
    """Episodes that ended in an infrastructure outcome (in none of the rates)."""
    previous_checkpoint_id: uuid.UUID | None = None
    """The checkpoint it is compared with, if any (with `promote_alias`: the champion, or
    the base while the alias is unset)."""
    previous: dict[str, float] | None = None
    """That checkpoint's three metrics on the same tasks."""
    delta: dict[str, float] = Field(default_factory=dict)
    """This minus previous, per metric."""
    heldout_tasks: int = 0
    """Held-out task instances evaluated."""
    flow_run_id: str | None = None
    """The evaluate flow run (for links in the UI)."""
    promotion: PromotionOutcome | None = None
    """The promote stage's decision (with `promote_alias`): promoted or kept, and why."""


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
    promotion: PromotionOutcome | None = None,
) -> EvaluationResult:
    """This checkpoint against the previous one (or the champion); the result, with the
    promotion decision, recorded on the checkpoint row."""
    from storage.db import make_engine
    from training.evaluation import compare_metrics
    from training.registry import record_evaluation

    result = EvaluationResult(
        checkpoint_id=checkpoint_id,
        completion_rate=metrics.completion_rate,
        avg_steps=metrics.avg_steps,
        tool_failure_rate=metrics.tool_failure_rate,
        n_episodes=metrics.n_episodes,
        parse_error_rate=metrics.parse_error_rate,
        n_infrastructure=metrics.n_infrastructure,
        previous_checkpoint_id=previous_id,
        previous=(
            {name: getattr(previous_metrics, name) for name in METRICS}
            if previous_metrics
            else None
        ),
        delta=compare_metrics(metrics, previous_metrics),
        heldout_tasks=heldout_tasks,
        flow_run_id=str(flow_run.id) if flow_run.id else None,
        promotion=promotion,
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


@task(name="promote", cache_policy=NONE, retries=0)
async def promote(
    settings: Settings,
    alias: str,
    checkpoint_id: uuid.UUID,
    episodes: list[Trajectory],
    comparison: Comparison,
    comparison_episodes: list[Trajectory],
    rule: PromotionRule,
) -> PromotionOutcome:
    """Decide on the two evaluations (same held-out tasks) and move the alias when the rule
    says so (`training.champion.promote_if_better`); the decision as a log line and the
    `promotion-<alias>` markdown artifact."""
    from storage.db import make_engine
    from storage.objects import make_object_store
    from training.champion import promote_if_better

    engine = make_engine(settings.database)
    try:
        store = make_object_store(settings.objects)
        outcome = await asyncio.to_thread(
            lambda: promote_if_better(
                engine,
                store,
                alias=alias,
                challenger=checkpoint_id,
                challenger_episodes=episodes,
                comparison=comparison,
                comparison_episodes=comparison_episodes,
                rule=rule,
                actor=f"evaluate flow run {flow_run.id}" if flow_run.id else "evaluate flow",
            )
        )
    finally:
        engine.dispose()
    get_run_logger().info("promote: %s", outcome.line())
    await acreate_markdown_artifact(
        markdown=promotion_markdown(outcome),
        key=artifact_key("promotion", alias),
        description=f"Promotion decision on the alias {alias}",
    )
    return outcome


def promotion_markdown(outcome: PromotionOutcome) -> str:
    """The promote stage's decision as markdown: the verdict, the reason, every figure."""
    verdict = "promoted" if outcome.promoted else "not promoted"
    against = f"`{outcome.compared_with}`" if outcome.compared_with else "nothing"
    lines = [
        f"# `{outcome.alias}`: checkpoint `{outcome.challenger_id}` {verdict}",
        "",
        f"Compared with the {outcome.role} {against}"
        + (f"; alias change {outcome.seq}." if outcome.seq is not None else "."),
        "",
        f"**Reason:** {outcome.reason}",
    ]
    if outcome.evidence:
        lines += ["", "| figure | value |", "|---|---|"]
        lines += [f"| {k} | {v} |" for k, v in outcome.evidence.items()]
    return "\n".join(lines) + "\n"


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
    if result.promotion is not None:
        lines += ["", f"Promotion: {result.promotion.line()}"]
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
    promote_alias: str | None = None,
    promotion: PromotionRule = PromotionRule(),  # noqa: B008 - frozen, shown in the form
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
        promote_alias: Compare with this alias's champion instead (the base it was trained
            from while the alias is unset) and point the alias at this checkpoint when the
            promotion rule says so.
        promotion: The promotion rule's thresholds.
    """
    from storage.db import make_engine
    from suites.registry import load_suite
    from training.champion import comparison_for

    route_library_logs()
    options = EvaluationOptions(
        instances=instances,
        templates=templates,
        suite=suite,
        max_steps=max_steps,
        max_new_tokens=max_new_tokens,
        promote_alias=promote_alias,
        promotion=promotion,
    )
    settings = load_settings()
    checkpoint_id = uuid.UUID(checkpoint)
    tasks = load_suite(suite, settings=settings.suites, sandbox=settings.sandbox).heldout_instances(
        instances, templates=templates
    )
    engine = make_engine(settings.database)
    try:
        # Read before anything runs: a promotion is written only if the alias is unchanged.
        comparison = (
            comparison_for(engine, checkpoint_id, alias=promote_alias)
            if compare_previous or promote_alias is not None
            else None
        )
    finally:
        engine.dispose()
    prev = comparison.checkpoint_id if comparison is not None else None
    prev = None if prev == checkpoint_id else prev  # already the champion: nothing to rerun
    episodes = await evaluation_episodes(settings, checkpoint_id, tasks, options)
    metrics = evaluation_metrics_task(episodes)
    previous_metrics = None
    previous_episodes: list[Trajectory] = []
    if prev is not None:
        previous_episodes = await evaluation_episodes(settings, prev, tasks, options)
        previous_metrics = evaluation_metrics_task(previous_episodes)
    decision = None
    if promote_alias is not None and comparison is not None:
        decision = await promote(
            settings,
            promote_alias,
            checkpoint_id,
            episodes,
            comparison,
            previous_episodes,
            promotion,
        )
    result = await compare_checkpoints(
        settings, checkpoint_id, metrics, prev, previous_metrics, len(tasks), decision
    )
    await acreate_markdown_artifact(
        markdown=comparison_markdown(result),
        key=f"eval-{str(checkpoint_id)[:8]}",
        description="Evaluation: this checkpoint against the previous one",
    )
    return result
