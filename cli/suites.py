"""`epiflow suites …`: list the task suites and check them with a policy in real sandboxes.

Mounted by `cli.app` as `epiflow suites`. Settings are built here (the entry point) and
passed down. User-facing failures (unknown suite, malformed `suite.yaml`, a generator script
that fails, bad policy spec, no sandbox) are printed on stderr and exit with code 2. `check`
exits 1 when a sandbox or verifier broke, when `--min-score` is not reached, when a
template is not deterministic (generated again from a fresh load, a seed gives another
task), and when the oracle (`scripted:oracle`) scores below 1.0 anywhere; each failed
instance is listed with its failing tool calls (command, exit code, stderr). On a Harbor
dataset, a task whose image does not build or whose verifier breaks is that task's
`env_error` (listed per task; the other tasks run), and each task refused at load is one
line with its category (`list` and `check`; they do not change the exit code).
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.terminal import TerminalConsole

if TYPE_CHECKING:
    from sandbox.settings import SandboxSettings
    from suites.check import CheckReport, InstanceResult
    from suites.harbor.suite import HarborSuite
    from suites.suite import Suite
    from tasks.types import TaskInstance

# The suites, their registry (it loads every suite.yaml), pydantic and rich's tables are
# imported by the commands that use them: `epiflow --help` lists this group without them.

app = typer.Typer(
    help="Task suites: list templates, check them with a policy in real sandboxes.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

_out = TerminalConsole(soft_wrap=True)
_err = TerminalConsole(stderr=True, soft_wrap=True)


def _fail(message: str) -> typer.Exit:
    _err.print(f"error: {message}", markup=False, highlight=False)
    return typer.Exit(code=2)


@app.command("list")
def list_suites(
    suite: Annotated[str | None, typer.Option(help="Only this suite.")] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """List suites and their templates (versions, difficulty); malformed user suites are reported."""
    from rich.table import Table

    from sandbox.settings import SandboxSettings
    from suites.errors import SuiteError
    from suites.registry import load_all_suites, load_suite
    from suites.settings import SuitesSettings

    settings, sandbox = SuitesSettings(), SandboxSettings()
    errors: list[SuiteError] = []
    if suite is not None:
        try:
            suites = [load_suite(suite, settings=settings, sandbox=sandbox)]
        except SuiteError as e:
            raise _fail(str(e)) from e
    else:
        suites, errors = load_all_suites(settings, sandbox=sandbox)
    if as_json:
        payload = {
            "suites": [_suite_json(s) for s in suites],
            "errors": [str(e) for e in errors],
        }
        typer.echo(json.dumps(payload, indent=2))
    else:
        for s in suites:
            table = Table(title=f"{s.name} v{s.version}" + (f" ({s.source})" if s.source else ""))
            for column in ("template", "version", "difficulty", "summary"):
                table.add_column(column)
            for info in s.info():
                table.add_row(info.template, info.version, str(info.difficulty), info.summary)
            _out.print(table)
            for refused in getattr(s, "refused", []):
                _out.print(f"refused {refused}", markup=False, highlight=False)
        for problem in errors:
            _err.print(f"error: {problem}", markup=False, highlight=False)
    if errors:
        raise typer.Exit(code=1)


@app.command("check")
def check(
    suite: Annotated[str, typer.Option(help="Suite name.")] = "builtin",
    policy: Annotated[
        str, typer.Option(help="Policy spec, e.g. scripted:oracle.")
    ] = "scripted:oracle",
    instances: Annotated[int, typer.Option(min=1, help="Instances per template.")] = 3,
    seed: Annotated[int, typer.Option(min=0, help="First instance seed.")] = 0,
    heldout: Annotated[bool, typer.Option(help="Use held-out (evaluation) seeds.")] = False,
    template: Annotated[
        list[str] | None, typer.Option(help="Only these templates (repeatable).")
    ] = None,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes run at once.")] = 2,
    min_score: Annotated[
        float | None, typer.Option(help="Exit 1 when the overall mean score is below this.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Run N instances of every template with a policy in real sandboxes; report scores.

    With the oracle (`scripted:oracle`, the default) every instance must score 1.0: below
    that the command exits 1 and shows the reference steps that failed.
    """
    import asyncio

    from sandbox import SandboxSettings
    from suites.check import ORACLE_POLICY, nondeterministic_templates
    from suites.errors import SuiteError
    from suites.harbor.suite import HarborSuite
    from suites.registry import load_suite
    from suites.settings import SuitesSettings

    sandbox_settings = SandboxSettings()
    try:
        loaded = load_suite(suite, settings=SuitesSettings(), sandbox=sandbox_settings)
        names = template if template else list(loaded.templates)
        for name in names:
            loaded.template(name)
        tasks = (
            loaded.heldout_instances(instances, seed=seed, templates=names)
            if heldout
            else loaded.instances(instances, seed=seed, templates=names)
        )
        unstable: list[str] = []
        if not isinstance(loaded, HarborSuite):  # Harbor tasks are static: nothing to redraw
            fresh = load_suite(suite, settings=SuitesSettings(), sandbox=sandbox_settings)
            unstable = nondeterministic_templates(tasks, fresh.generate)
    except SuiteError as e:
        raise _fail(str(e)) from e
    report = asyncio.run(_run_check(loaded, tasks, policy, concurrency, sandbox_settings, unstable))
    if isinstance(loaded, HarborSuite):
        report = _with_harbor_tasks(loaded, tasks, report, concurrency, sandbox_settings)
    if as_json:
        typer.echo(report.model_dump_json(indent=2))
    else:
        _print_report(report)
    problems = [
        f"template {name!r} is not deterministic: the same seed gave a different task when "
        "generated again (its generator must draw every choice from random.Random(seed))"
        for name in report.nondeterministic
    ]
    if report.environment_errors:
        problems.append(f"{report.environment_errors} instance(s) hit a sandbox or verifier error")
    if policy == ORACLE_POLICY and report.below_full:
        total = sum(t.instances for t in report.templates)
        problems.append(
            f"the oracle scored below 1.0 on {report.below_full} of {total} instance(s): "
            "a reference solution or its verifier is wrong (see the failing steps)"
        )
    idle_scored = [t.task for t in report.harbor_tasks if t.idle_score]
    if idle_scored:
        problems.append(
            f"scripted:idle scored above 0 on {', '.join(idle_scored)}: a verifier passes without work"
        )
    if min_score is not None and report.mean_score < min_score:
        problems.append(f"mean score {report.mean_score:.3f} is below --min-score {min_score:g}")
    for problem in problems:
        _err.print(f"error: {problem}", markup=False, highlight=False)
    if problems:
        raise typer.Exit(code=1)


@app.command("export")
def export(
    suite: Annotated[str, typer.Option(help="Suite name (built-in or a user suite).")] = "builtin",
    out: Annotated[str, typer.Option(help="Folder to write the task directories into.")] = "",
    export_format: Annotated[str, typer.Option("--format", help="Only `harbor`.")] = "harbor",
    templates: Annotated[
        str | None, typer.Option(help="Comma-separated templates (default: all).")
    ] = None,
    instances: Annotated[int, typer.Option(min=1, help="Instances per template.")] = 1,
    seed: Annotated[int, typer.Option(min=0, help="First instance seed.")] = 0,
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Write seeded instances as Harbor task directories (tests run offline; docs/harbor.md)."""
    from pathlib import Path

    from sandbox.settings import SandboxSettings
    from suites.errors import SuiteError
    from suites.harbor.export import export_task
    from suites.registry import load_suite
    from suites.settings import SuitesSettings

    if export_format != "harbor":
        raise _fail(f"--format: only `harbor` is supported, got {export_format!r}")
    if not out:
        raise _fail("--out: name the folder to write the task directories into")
    try:
        loaded = load_suite(suite, settings=SuitesSettings(), sandbox=SandboxSettings())
        names = [t.strip() for t in templates.split(",") if t.strip()] if templates else None
        tasks = loaded.instances(instances, seed=seed, templates=names)
    except SuiteError as e:
        raise _fail(str(e)) from e
    if any(t.environment is not None for t in tasks):
        raise _fail(f"--suite: {suite!r} is a Harbor dataset already; its folders are the export")
    target = Path(out)
    target.mkdir(parents=True, exist_ok=True)
    written = [str(export_task(task, target)) for task in tasks]
    if as_json:
        typer.echo(json.dumps({"format": "harbor", "out": str(target), "tasks": written}))
    else:
        for path in written:
            _out.print(path, markup=False, highlight=False)


def _with_harbor_tasks(
    suite: HarborSuite,
    tasks: list[TaskInstance],
    report: CheckReport,
    concurrency: int,
    sandbox_settings: SandboxSettings,
) -> CheckReport:
    """`report` with one `HarborTaskCheck` per task (the idle policy runs on each built
    task's first instance: it must score 0; times and infrastructure outcomes from the
    instances) and the tasks refused at load."""
    import asyncio

    from suites.check import HarborTaskCheck

    first = list({t.template: t for t in reversed(tasks)}.values())[::-1]
    built = [t for t in first if t.environment is None or not t.environment.build_error]
    idle = asyncio.run(_run_check(suite, built, "scripted:idle", concurrency, sandbox_settings, []))
    idle_by = {r.template: r for t in idle.templates for r in t.failed}
    env_by = {t.template: t.environment for t in first}
    rows: list[HarborTaskCheck] = []
    for check in report.templates:
        idle_row = next((t for t in idle.templates if t.template == check.template), None)
        broken = idle_by.get(check.template)
        idle_score = None if broken is not None and broken.verifier_error else (
            idle_row.mean_score if idle_row else None
        )  # fmt: skip
        env = env_by.get(check.template)
        infra = [r for r in check.failed if r.verifier_error]
        rows.append(
            HarborTaskCheck(
                task=check.template, score=check.mean_score, idle_score=idle_score,
                build_s=None if env is None or env.build_error else env.build_s,
                verify_s=check.verify_s, env_errors=len(infra),
                reason=infra[0].reason if infra else "",
            )
        )  # fmt: skip
    return report.model_copy(update={"harbor_tasks": rows, "harbor_refused": suite.refused})


async def _run_check(
    suite: Suite,
    tasks: list[TaskInstance],
    policy_spec: str,
    concurrency: int,
    sandbox_settings: SandboxSettings,
    nondeterministic: list[str],
) -> CheckReport:
    import asyncio

    from agent.errors import PolicySpecError
    from agent.loop import run_episode
    from agent.policies import make_policy
    from agent.settings import LoopSettings, PolicySettings
    from agent.trajectory import INFRASTRUCTURE_STATUSES, EpisodeStatus
    from sandbox import SandboxSpec, open_sandbox
    from suites.check import InstanceResult, failed_steps, summarize

    try:
        policy = make_policy(policy_spec, settings=PolicySettings())
    except PolicySpecError as e:
        raise _fail(str(e)) from e
    spec = SandboxSpec()
    loop_settings = LoopSettings()
    gate = asyncio.Semaphore(concurrency)

    async def opener(spec: SandboxSpec, **kwargs: Any) -> Any:
        return await open_sandbox(spec, settings=sandbox_settings, **kwargs)

    async def one(task: TaskInstance) -> InstanceResult:
        async with gate:
            traj = await run_episode(
                task,
                policy,
                spec=spec,
                run_key=f"suites-check/{suite.name}@{suite.version}/{policy_spec}",
                settings=loop_settings,
                open_sandbox=opener,
            )
        env_broken = traj.status in INFRASTRUCTURE_STATUSES
        harbor = (traj.verifier_details or {}).get("harbor") or {}
        return InstanceResult(
            template=task.template,
            seed=task.seed,
            task_id=task.task_id,
            score=traj.verifier_score or 0.0,
            success=traj.status == EpisodeStatus.SUCCESS,
            status=str(traj.status),
            # An infrastructure outcome's own reason (a failed build, `substituted-base: …`)
            # says why; otherwise the verifier's says what it found.
            reason=(traj.failure_reason if env_broken else None)
            or traj.verifier_reason
            or traj.failure_reason
            or "",
            verifier_error=env_broken,
            content_digest=task.content_digest,
            failed_steps=failed_steps(traj.steps),
            build_s=harbor.get("build_s"),
            verify_s=harbor.get("verify_s"),
        )

    try:
        results = await asyncio.gather(*(one(task) for task in tasks))
    finally:
        await policy.aclose()
    return summarize(suite, policy_spec, results, nondeterministic=nondeterministic)


def _suite_json(suite: Suite) -> dict[str, Any]:
    return {
        "name": suite.name,
        "version": suite.version,
        "description": suite.description,
        "source": str(suite.source) if suite.source else None,
        "templates": [
            info.model_dump(include={"template", "version", "difficulty", "summary"})
            for info in suite.info()
        ],
        "refused": [r.model_dump(mode="json") for r in getattr(suite, "refused", [])],
    }


def _print_report(report: CheckReport) -> None:
    from rich.table import Table

    from suites.check import ORACLE_POLICY

    table = Table(title=f"{report.suite} v{report.suite_version} with {report.policy}")
    for column in (
        "template",
        "difficulty",
        "instances",
        "distinct",
        "mean_score",
        "failures",
        "first failure",
    ):
        table.add_column(column)
    for t in report.templates:
        first = t.failed[0].reason[:40] if t.failed else ""
        table.add_row(
            t.template,
            str(t.difficulty),
            str(t.instances),
            str(t.distinct),
            f"{t.mean_score:.3f}",
            str(t.failures),
            first,
        )
    _out.print(table)
    _out.print(f"overall mean_score: {report.mean_score:.3f}")
    if report.harbor_tasks:
        harbor = Table(title="Harbor tasks")
        for column in ("task", "score", "idle score", "build s", "verify s", "env_error"):
            harbor.add_column(column)
        for h in report.harbor_tasks:
            harbor.add_row(
                h.task,
                f"{h.score:.3f}",
                "env error" if h.idle_score is None else f"{h.idle_score:.3f}",
                "-" if h.build_s is None else f"{h.build_s:.1f}",
                "-" if h.verify_s is None else f"{h.verify_s:.1f}",
                f"{h.env_errors}: {h.reason[:60]}" if h.env_errors else "-",
            )
        _out.print(harbor)
    for refused in report.harbor_refused:
        _out.print(f"refused {refused}", markup=False, highlight=False)
    label = "reference step" if report.policy == ORACLE_POLICY else "step"
    for t in report.templates:
        for r in t.failed:
            _out.print(
                f"\n{r.template} seed {r.seed}: score {r.score:.3f}, {r.status}: {r.reason}",
                markup=False,
                highlight=False,
            )
            for step in r.failed_steps:
                how = (
                    "timed out"
                    if step.timed_out
                    else f"exit code {step.exit_code}"
                    if step.exit_code is not None
                    else f"signal {step.signal}"
                    if step.signal is not None
                    else step.error_type or "failed"
                )
                if step.error_type and step.error_type not in how:
                    how += f" ({step.error_type})"
                _out.print(
                    f"  failing {label} {step.index} ({step.tool}): {how}\n"
                    f"    $ {step.command}\n" + _indented("stderr: ", step.stderr or "(empty)"),
                    markup=False,
                    highlight=False,
                )


def _indented(prefix: str, text: str) -> str:
    lines = text.splitlines() or [""]
    pad = " " * (4 + len(prefix))
    return f"    {prefix}{lines[0]}" + "".join(f"\n{pad}{line}" for line in lines[1:])
