"""A checkpoint as a policy on held-out tasks in real sandboxes, and the metrics deployment watches.

Seed 000 §4.5 names what to monitor after deployment: task completion rate, average
steps and tool-call failure rate; the same three measure a checkpoint here, against the
previous checkpoint. `evaluation_metrics` is pure (trajectories in, numbers out);
`evaluate_model_dir` runs the episodes with the `hf:` policy through the real loop.

Definitions:

- `completion_rate`: episodes whose verifier confirmed success / episodes.
- `avg_steps`: mean assistant turns per episode.
- `tool_failure_rate`: among turns that were meant to act (every turn except a parsed
  `<final>`), those that failed: unparsable (protocol error or no block) or a call that
  ran and failed (non-zero exit, typed error, timeout, signal). 0 when no turn acted.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

from pydantic import BaseModel, Field

from agent.trajectory import EpisodeStatus, ParseKind, Step, Trajectory
from suites.types import TaskInstance

__all__ = [
    "EvaluationMetrics",
    "EvaluationReport",
    "compare_metrics",
    "evaluate_model_dir",
    "evaluation_metrics",
    "run_model_episodes",
]


class EvaluationMetrics(BaseModel):
    """The three numbers the CLI prints, plus counts."""

    completion_rate: float
    """Verifier-confirmed successes / episodes."""
    avg_steps: float
    """Mean assistant turns per episode."""
    tool_failure_rate: float
    """Failed acting turns / acting turns."""
    n_episodes: int
    """Episodes evaluated."""
    n_acting_turns: int = 0
    """Turns that were meant to act (denominator of `tool_failure_rate`)."""


class EvaluationReport(BaseModel):
    """A checkpoint's evaluation, with the previous checkpoint's for comparison."""

    metrics: EvaluationMetrics
    """This checkpoint."""
    previous: EvaluationMetrics | None = None
    """The previous checkpoint on the same tasks, when there is one."""
    delta: dict[str, float] = Field(default_factory=dict)
    """This minus previous, per metric."""
    task_ids: list[str] = Field(default_factory=list)
    """Task instances evaluated."""
    statuses: dict[str, int] = Field(default_factory=dict)
    """Episodes per status."""


def _turn_failed(step: Step) -> bool:
    if step.parse_kind in (ParseKind.ERROR, ParseKind.NONE) or step.parse_error is not None:
        return True
    return step.tool_failed


def evaluation_metrics(trajectories: Sequence[Trajectory]) -> EvaluationMetrics:
    """The metrics of a set of episodes (see the module docstring)."""
    n = len(trajectories)
    if n == 0:
        return EvaluationMetrics(
            completion_rate=0.0, avg_steps=0.0, tool_failure_rate=0.0, n_episodes=0
        )
    successes = sum(t.status == EpisodeStatus.SUCCESS for t in trajectories)
    steps = sum(t.n_steps for t in trajectories)
    acting = [s for t in trajectories for s in t.steps if s.parse_kind != ParseKind.FINAL]
    failed = sum(_turn_failed(s) for s in acting)
    return EvaluationMetrics(
        completion_rate=successes / n,
        avg_steps=steps / n,
        tool_failure_rate=failed / len(acting) if acting else 0.0,
        n_episodes=n,
        n_acting_turns=len(acting),
    )


def compare_metrics(
    current: EvaluationMetrics, previous: EvaluationMetrics | None
) -> dict[str, float]:
    """Per-metric difference current - previous (empty without a previous evaluation)."""
    if previous is None:
        return {}
    return {
        name: getattr(current, name) - getattr(previous, name)
        for name in ("completion_rate", "avg_steps", "tool_failure_rate")
    }


async def run_model_episodes(
    model_dir: Path,
    tasks: Sequence[TaskInstance],
    *,
    run_key: str,
    max_steps: int = 8,
    max_new_tokens: int = 256,
    concurrency: int = 2,
) -> list[Trajectory]:
    """One episode per task with the `hf:` policy at `model_dir`, in real sandboxes (async)."""
    from agent.loop import run_episode
    from agent.policies.hf import HFPolicy
    from agent.settings import LoopSettings, PolicySettings
    from sandbox import SandboxSpec

    policy = HFPolicy(model_dir, PolicySettings(max_tokens=max_new_tokens))
    loop = LoopSettings(max_steps=max_steps, max_consecutive_parse_failures=max_steps)
    spec = SandboxSpec()
    gate = asyncio.Semaphore(concurrency)

    async def one(task: TaskInstance) -> Trajectory:
        async with gate:
            return await run_episode(task, policy, spec=spec, run_key=run_key, settings=loop)

    try:
        return list(await asyncio.gather(*(one(t) for t in tasks)))
    finally:
        await policy.aclose()


def evaluate_model_dir(
    model_dir: Path,
    tasks: Sequence[TaskInstance],
    *,
    run_key: str,
    max_steps: int = 8,
    max_new_tokens: int = 256,
    concurrency: int = 2,
) -> tuple[EvaluationMetrics, list[Trajectory]]:
    """Run every task once with the `hf:` policy at `model_dir` in real sandboxes (sync;
    inside a running event loop use `run_model_episodes` + `evaluation_metrics`).

    Returns the metrics and the trajectories (persist them with
    `storage.episodes.persist_episodes` to keep the evaluation episodes as data).
    `max_new_tokens` caps each turn; `max_steps` also bounds consecutive parse failures,
    so an untrained model runs its full budget instead of stopping at the first garbage.
    """
    trajectories = asyncio.run(
        run_model_episodes(
            model_dir,
            tasks,
            run_key=run_key,
            max_steps=max_steps,
            max_new_tokens=max_new_tokens,
            concurrency=concurrency,
        )
    )
    return evaluation_metrics(trajectories), trajectories
