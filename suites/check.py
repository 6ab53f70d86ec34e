"""`epiflow suites check`: the per-template summary of running a policy over a suite.

Running the episodes is the CLI's job (it composes `agent.loop.run_episode` with a real
sandbox); this module holds the pure part — one `InstanceResult` per episode in, a
`CheckReport` out, `failed_steps` (the tool calls of an episode that failed: for the oracle,
the reference steps that broke) — and `replay_reference`, which drives a task's reference
solution straight through a sandbox (a fast check of a template and its verifier without a
policy).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable

from pydantic import BaseModel, ConfigDict, Field

from agent.trajectory import Step
from sandbox.interface import Sandbox
from sandbox.types import ToolResult
from suites.harbor.errors import RefusedTask
from suites.suite import Suite
from tasks.types import TaskInstance

ORACLE_POLICY = "scripted:oracle"
"""The policy that replays reference solutions: it must score 1.0 on every instance."""
MAX_STEP_STDERR_CHARS = 1_000
"""How much of a failing step's stderr a check keeps (the end: where errors are)."""


class FailedStep(BaseModel):
    """A tool call of an episode that did not succeed (`Step.tool_failed`)."""

    model_config = ConfigDict(frozen=True)

    index: int
    """0-based step index in the episode."""
    tool: str
    """Tool name."""
    command: str
    """What ran: the shell command of `execute_shell`, else the call's arguments as JSON."""
    exit_code: int | None = None
    """Exit code; None when the call did not run a command or was killed by a signal."""
    signal: int | None = None
    """Signal that killed the command, if any."""
    timed_out: bool = False
    """True when the call hit its timeout."""
    error_type: str | None = None
    """Typed tool failure (`nonzero_exit`, `not_found`, …)."""
    stderr: str = ""
    """The end of the call's stderr (at most `MAX_STEP_STDERR_CHARS`)."""


def failed_steps(steps: Iterable[Step]) -> list[FailedStep]:
    """The steps whose tool call failed, in order (the one rule: `Step.tool_failed`)."""
    out: list[FailedStep] = []
    for step in steps:
        if not step.tool_failed:
            continue
        args = step.args or {}
        command = args.get("command")
        stderr = step.stderr.strip()
        out.append(
            FailedStep(
                index=step.index,
                tool=step.tool or "?",
                command=command
                if step.tool == "execute_shell" and isinstance(command, str)
                else json.dumps(args, ensure_ascii=False, sort_keys=True),
                exit_code=step.exit_code,
                signal=step.signal,
                timed_out=step.timed_out,
                error_type=step.error_type,
                stderr=stderr[-MAX_STEP_STDERR_CHARS:],
            )
        )
    return out


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
    content_digest: str = ""
    """`TaskInstance.content_digest`: equal digests mean the seeds gave the same task."""
    failed_steps: list[FailedStep] = Field(default_factory=list)
    """The episode's tool calls that failed (for the oracle: broken reference steps)."""
    build_s: float | None = None
    """A Harbor task's image build time, seconds (when it was built); None otherwise."""
    verify_s: float | None = None
    """A Harbor task's verifier time (export, verifier jail, test.sh), seconds."""


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
    distinct: int
    """Distinct tasks among the instances (fewer than `instances`: seeds that gave the same
    task; expected only of static templates)."""
    below_full: int
    """Instances the verifier scored below 1.0 (an infrastructure outcome is not counted:
    it was never scored, and it is `environment_errors`'s)."""
    failed: list[InstanceResult] = Field(default_factory=list)
    """The instances that did not succeed or scored below 1.0, for diagnosis."""
    verify_s: float | None = None
    """Mean verifier time of the instances that report one (Harbor tasks), seconds."""


class HarborTaskCheck(BaseModel):
    """One Harbor task in `epiflow suites check`."""

    model_config = ConfigDict(frozen=True)

    task: str
    score: float
    """Mean score of the checked policy (the oracle must score 1.0)."""
    idle_score: float | None
    """Score of `scripted:idle` (must be 0); None when it hit an environment error."""
    build_s: float | None
    """Seconds the image's build took."""
    verify_s: float | None
    """Mean seconds of the verifier of the checked policy's episodes."""
    env_errors: int = 0
    """The checked policy's episodes of this task that were infrastructure outcomes
    (`env_error`: the image did not build, the verifier broke), not the policy's."""
    reason: str = ""
    """The first such episode's reason (e.g. the build's failing line), else empty."""


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
    nondeterministic: list[str] = Field(default_factory=list)
    """Templates whose first instance came out different when generated again from a fresh
    load of the suite (a generator script that does not draw everything from its seed)."""
    harbor_tasks: list[HarborTaskCheck] = Field(default_factory=list)
    """Per Harbor task (a Harbor dataset only): the policy's score, the idle policy's score
    (`scripted:idle` must score 0), build and verify times, its infrastructure outcomes."""
    harbor_refused: list[RefusedTask] = Field(default_factory=list)
    """The dataset's tasks refused at load (not run), one each with its category."""

    @property
    def below_full(self) -> int:
        """Instances the verifier scored below 1.0 (the oracle must have none)."""
        return sum(t.below_full for t in self.templates)


def summarize(
    suite: Suite,
    policy: str,
    results: Iterable[InstanceResult],
    *,
    nondeterministic: Iterable[str] = (),
) -> CheckReport:
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
        failed = [r for r in items if not r.success or r.score < 1.0]
        checks.append(
            TemplateCheck(
                template=name,
                version=template.version if template else "?",
                difficulty=template.difficulty if template else 0,
                instances=len(items),
                mean_score=_mean([r.score for r in items]),
                failures=sum(not r.success for r in items),
                below_full=sum(r.score < 1.0 and not r.verifier_error for r in items),
                distinct=len({r.content_digest or r.task_id for r in items}),
                failed=failed,
                verify_s=_mean(times)
                if (times := [r.verify_s for r in items if r.verify_s is not None])
                else None,
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
        nondeterministic=list(nondeterministic),
    )


def nondeterministic_templates(
    tasks: Iterable[TaskInstance], regenerate: Callable[[str, int], TaskInstance]
) -> list[str]:
    """Templates whose first task in `tasks` differs from `regenerate(template, seed)`.

    `regenerate` should come from a freshly loaded suite, so no cached draft hides a
    generator that reads the clock or an unseeded random source.

    Raises:
        SuiteError: from `regenerate` (e.g. a generator that fails on the second run).
    """
    first: dict[str, TaskInstance] = {}
    for task in tasks:
        first.setdefault(task.template, task)
    return [name for name, task in first.items() if regenerate(name, task.seed) != task]


async def replay_reference(sandbox: Sandbox, task: TaskInstance) -> list[ToolResult]:
    """Run `task.reference_solution` through `sandbox.call_tool`, in order; return the results.

    A failing call is not an error here (a reference may run failing tests on purpose).

    Raises:
        SandboxCrashed, EpisodeHardTimeout: from the sandbox.
    """
    return [await sandbox.call_tool(call.tool, call.args) for call in task.reference_solution]


def _mean(values: list[float]) -> float:
    return round(sum(values) / len(values), 4) if values else 0.0
