"""A checkpoint as a policy on held-out tasks in real sandboxes, and the metrics deployment watches.

Seed 000 §4.5 names what to monitor after deployment: task completion rate, average
steps and tool-call failure rate; the same three measure a checkpoint here, against the
previous checkpoint. `evaluation_metrics` is pure (trajectories in, numbers out); the episodes themselves
run as a collection (`collection.evaluation`: `hf:` in process, or any policy such as
`openai:` on a served checkpoint), one floor up.

Definitions:

- `completion_rate`: episodes whose verifier confirmed success / episodes. Episodes that
  ended in an infrastructure outcome (`agent.trajectory.INFRASTRUCTURE_STATUSES`) are
  counted apart (`n_infrastructure`) and in none of the rates.
- `avg_steps`: mean assistant turns per episode.
- `tool_failure_rate`: among turns that were meant to act (every turn except a parsed
  `<final>`), those that failed: unparsable (protocol error or no block) or a call that
  ran and failed by the shared rule `agent.trajectory.Step.tool_failed` (non-zero exit,
  typed error, timeout, signal; `models.step.tool_failed_sql()` in SQL). 0 when no turn
  acted.

With the tasks at hand (`evaluation_metrics(trajectories, tasks)`), every turn is also
compared with the reference solution at the point the episode had reached
(`agent.policies.scripted.reference_cursor`: the reference call the oracle would make
next), so a change's effect is visible before completion moves. Rates are over all
assistant turns, and are training's own definitions (not the shared failed-call rule):

- `parse_error_rate`: no block or a protocol error.
- `wrong_tool_rate`: a parsed call of another tool than the reference call.
- `wrong_content_rate` ("right call, wrong content"): the reference tool with other
  arguments (a differently formatted but equivalent file counts here too).
- `premature_final_rate`: `<final>` while reference calls remain.
- `exact_call_rate`: the reference call itself (tool and arguments).

`by_template` is the completion rate per task template.
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import BaseModel, Field

from agent.policies.scripted import reference_cursor
from agent.trajectory import (
    INFRASTRUCTURE_STATUSES,
    EpisodeStatus,
    ParseKind,
    Step,
    Trajectory,
)
from tasks.types import TaskInstance

__all__ = [
    "EvaluationMetrics",
    "EvaluationReport",
    "compare_metrics",
    "evaluation_metrics",
    "turn_failed",
    "turn_kind",
    "turn_unparsed",
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
    """Episodes evaluated (infrastructure outcomes left out)."""
    n_infrastructure: int = 0
    """Episodes that ended in an infrastructure outcome (`INFRASTRUCTURE_STATUSES`: a
    sandbox, store or endpoint failure), in none of the rates."""
    n_acting_turns: int = 0
    """Turns that were meant to act (denominator of `tool_failure_rate`)."""
    by_template: dict[str, float] = Field(default_factory=dict)
    """Completion rate per task template."""
    n_turns: int = 0
    """Assistant turns (denominator of the turn rates below)."""
    parse_error_rate: float | None = None
    """Turns with no block or a protocol error / turns."""
    wrong_tool_rate: float | None = None
    """Parsed calls of another tool than the reference call / turns (None without tasks)."""
    wrong_content_rate: float | None = None
    """Reference tool, other arguments / turns (None without tasks)."""
    premature_final_rate: float | None = None
    """`<final>` while reference calls remain / turns (None without tasks)."""
    exact_call_rate: float | None = None
    """The reference call itself / turns (None without tasks)."""


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


def turn_unparsed(step: Step) -> bool:
    """The turn did not parse: no block, or a protocol error (`parse_error_rate`)."""
    return step.parse_kind in (ParseKind.ERROR, ParseKind.NONE) or step.parse_error is not None


def turn_failed(step: Step) -> bool:
    """An acting turn failed: it did not parse, or its call failed (`tool_failure_rate`)."""
    if turn_unparsed(step):
        return True
    return step.tool_failed


def turn_kind(step: Step, previous: list[Step], task: TaskInstance) -> str:
    """How one turn compares with the reference solution at that point of the episode:
    `parse_error`, `premature_final`, `final`, `wrong_tool`, `wrong_content`, `exact` or
    `extra_call` (a call after the reference solution was complete)."""
    if turn_unparsed(step):
        return "parse_error"
    reference = task.reference_solution
    cursor = reference_cursor(previous)
    if step.parse_kind == ParseKind.FINAL:
        return "premature_final" if cursor < len(reference) else "final"
    if cursor >= len(reference):
        return "extra_call"
    expected = reference[cursor]
    if step.tool != expected.tool:
        return "wrong_tool"
    return "exact" if dict(step.args or {}) == expected.args else "wrong_content"


def _rate(count: int, total: int) -> float:
    return count / total if total else 0.0


def evaluation_metrics(
    trajectories: Sequence[Trajectory], tasks: Sequence[TaskInstance] | None = None
) -> EvaluationMetrics:
    """The metrics of a set of episodes (see the module docstring); the turn rates against
    the reference solutions need the `tasks` the episodes ran. Infrastructure outcomes
    are never the agent's: they are counted (`n_infrastructure`) and left out of every rate."""
    infrastructure = sum(t.status in INFRASTRUCTURE_STATUSES for t in trajectories)
    trajectories = [t for t in trajectories if t.status not in INFRASTRUCTURE_STATUSES]
    n = len(trajectories)
    if n == 0:
        return EvaluationMetrics(
            completion_rate=0.0,
            avg_steps=0.0,
            tool_failure_rate=0.0,
            n_episodes=0,
            n_infrastructure=infrastructure,
        )
    successes = sum(t.status == EpisodeStatus.SUCCESS for t in trajectories)
    steps = sum(t.n_steps for t in trajectories)
    acting = [s for t in trajectories for s in t.steps if s.parse_kind != ParseKind.FINAL]
    failed = sum(turn_failed(s) for s in acting)
    by_template: dict[str, list[bool]] = {}
    for t in trajectories:
        by_template.setdefault(t.template, []).append(t.status == EpisodeStatus.SUCCESS)
    turns = [s for t in trajectories for s in t.steps]
    parse_errors = sum(turn_unparsed(s) for s in turns)
    metrics = EvaluationMetrics(
        completion_rate=successes / n,
        avg_steps=steps / n,
        tool_failure_rate=failed / len(acting) if acting else 0.0,
        n_episodes=n,
        n_infrastructure=infrastructure,
        n_acting_turns=len(acting),
        by_template={k: sum(v) / len(v) for k, v in sorted(by_template.items())},
        n_turns=len(turns),
        parse_error_rate=_rate(parse_errors, len(turns)),
    )
    if tasks is None:
        return metrics
    by_id = {task.task_id: task for task in tasks}
    kinds: dict[str, int] = {}
    for t in trajectories:
        task = by_id.get(t.task_id)
        if task is None:
            continue
        for i, step in enumerate(t.steps):
            kind = turn_kind(step, t.steps[:i], task)
            kinds[kind] = kinds.get(kind, 0) + 1
    total = len(turns)
    return metrics.model_copy(
        update={
            "wrong_tool_rate": _rate(kinds.get("wrong_tool", 0), total),
            "wrong_content_rate": _rate(kinds.get("wrong_content", 0), total),
            "premature_final_rate": _rate(kinds.get("premature_final", 0), total),
            "exact_call_rate": _rate(kinds.get("exact", 0), total),
        }
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
