"""`epiflow suites check`: the per-template summary of running a policy over a suite.

Running the episodes is the CLI's job (it composes `agent.loop.run_episode` with a real
sandbox); this module holds the pure part — one `InstanceResult` per episode in, a
`CheckReport` out — and `replay_reference`, which drives a task's reference solution
straight through a sandbox (a fast check of a template and its verifier without a policy).
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import BaseModel, ConfigDict, Field

from sandbox.interface import Sandbox
from sandbox.types import ToolResult
from suites.suite import Suite
from suites.types import TaskInstance


class InstanceResult(BaseModel):
    """How one instance went."""

    model_config = ConfigDict(frozen=True)

    template: str
    """Template name."""
    seed: int
    """Instance seed."""
    task_id: str
    """The instance's task id."""
    score: float
    """Verifier score; 0 when the verifier did not run or failed."""
    success: bool
    """True when the episode succeeded (status `success`)."""
    status: str
    """Episode status (`success`, `failed`, `env_error`, …)."""
    reason: str = ""
    """Verifier reason or failure reason."""
    verifier_error: bool = False
    """True when the verifier itself failed or the environment broke."""


class TemplateCheck(BaseModel):
    """Aggregate of one template's instances."""

    model_config = ConfigDict(frozen=True)

    template: str
    """Template name."""
    version: str
    """Template version."""
    difficulty: int
    """1 … 5."""
    instances: int
    """Instances run."""
    mean_score: float
    """Mean verifier score over the instances."""
    failures: int
    """Instances that did not succeed."""
    failed: list[InstanceResult] = Field(default_factory=list)
    """The failed instances, for diagnosis."""


class CheckReport(BaseModel):
    """Result of `epiflow suites check`."""

    model_config = ConfigDict(frozen=True)

    suite: str
    """Suite name."""
    suite_version: str
    """Suite version."""
    policy: str
    """Policy spec that ran."""
    templates: list[TemplateCheck]
    """One entry per template, in the suite's order."""
    mean_score: float
    """Mean score over every instance."""
    environment_errors: int
    """Instances whose sandbox or verifier broke (not the policy's fault)."""


def summarize(suite: Suite, policy: str, results: Iterable[InstanceResult]) -> CheckReport:
    """Group instance results by template, in the suite's template order."""
    grouped: dict[str, list[InstanceResult]] = {}
    for result in results:
        grouped.setdefault(result.template, []).append(result)
    order = [name for name in suite.templates if name in grouped]
    by_template = {name: grouped[name] for name in order + sorted(set(grouped) - set(order))}
    checks: list[TemplateCheck] = []
    everything: list[InstanceResult] = []
    for name, items in by_template.items():
        template = suite.templates.get(name)
        failed = [r for r in items if not r.success]
        checks.append(
            TemplateCheck(
                template=name,
                version=template.version if template else "?",
                difficulty=template.difficulty if template else 0,
                instances=len(items),
                mean_score=_mean([r.score for r in items]),
                failures=len(failed),
                failed=failed,
            )
        )
        everything += items
    return CheckReport(
        suite=suite.name,
        suite_version=suite.version,
        policy=policy,
        templates=checks,
        mean_score=_mean([r.score for r in everything]),
        environment_errors=sum(r.verifier_error for r in everything),
    )


async def replay_reference(sandbox: Sandbox, task: TaskInstance) -> list[ToolResult]:
    """Run `task.reference_solution` through `sandbox.call_tool`, in order; return the results.

    A failing call is not an error here (a reference may run failing tests on purpose).

    Raises:
        SandboxCrashed, EpisodeHardTimeout: from the sandbox.
    """
    return [await sandbox.call_tool(call.tool, call.args) for call in task.reference_solution]


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0
