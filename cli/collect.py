"""CLI commands around collected episodes: collect, show, export, import, replay."""

from __future__ import annotations

import contextlib
import json
import shlex
import signal
import sys
import threading
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TypeVar

import typer

from cli.stores import load_settings, stores
from cli.terminal import TerminalConsole, console_logs_without_tracebacks
from core.errors import reason_line

if TYPE_CHECKING:
    from cli.interrupts import Interrupted
    from collection.lifecycle import Collection, CollectionOutcome
    from collection.request import CollectResult
    from config.settings import Settings

T = TypeVar("T")

err = TerminalConsole(stderr=True, soft_wrap=True)
out = TerminalConsole(soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]


EXIT_RERUN = 3
"""`epiflow collect`'s exit code when the run finished but some episodes hit an
infrastructure failure (`env_error`, `storage_error`): re-running the key redoes them."""


def collect(
    suite: Annotated[str, typer.Option(help="Suite name.")] = "builtin",
    policy: Annotated[
        str,
        typer.Option(help="Policy spec: scripted:oracle|noisy|idle, openai:URL#MODEL, hf:PATH."),
    ] = "scripted:oracle",
    tasks: Annotated[int, typer.Option(min=1, help="Task instances per template.")] = 1,
    rollouts: Annotated[int, typer.Option(min=1, help="Rollouts per task instance.")] = 1,
    concurrency: Annotated[int, typer.Option(min=1, help="Episodes running at once.")] = 4,
    faults: Annotated[
        str | None, typer.Option(help="Fault profile: none, light, heavy, or JSON.")
    ] = None,
    run_key: Annotated[
        str | None,
        typer.Option(
            help="Run key; re-running a key resumes it. Default: a new key, printed first."
        ),
    ] = None,
    templates: Annotated[
        str | None, typer.Option(help="Comma-separated templates (default: all).")
    ] = None,
    seed: Annotated[int, typer.Option(min=0, help="First instance seed.")] = 0,
    shards: Annotated[
        int, typer.Option(min=1, help="Split the run into shards on a work pool.")
    ] = 1,
    shard_deployment: Annotated[
        str | None, typer.Option(help="Deployment running the shards, e.g. collect-shard/shard.")
    ] = None,
    gate: Annotated[
        bool, typer.Option(help="Run the QC gate on the result (trigger: none).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Collect episodes in sandboxes through the `collect-episodes` Prefect flow.

    Exit code 0 when the run is complete; 3 when some episodes hit an infrastructure
    failure (the last line says how many and why; re-running the key redoes them) or the
    database failed mid-run (the line says why and how to resume); 2 on
    bad input or settings (nothing written); 130/143 when interrupted by SIGINT/SIGTERM
    (finished episodes saved; the last line says how to resume).
    """
    from cli.interrupts import Interrupted, run_interruptibly
    from cli.progress import episode_progress
    from collection.lifecycle import open_collection
    from collection.request import CollectRequest, fresh_run_key
    from orchestration.prefect import apply_prefect_settings

    settings = load_settings()
    if shards > 1 and not shard_deployment:
        raise typer.BadParameter("--shards needs --shard-deployment (e.g. collect-shard/shard)")
    request = CollectRequest.from_options(
        suite=suite,
        policy=policy,
        tasks=tasks,
        rollouts=rollouts,
        concurrency=concurrency,
        faults=faults,
        run_key=run_key,
        seed=seed,
        templates=[t.strip() for t in templates.split(",") if t.strip()] if templates else None,
    )
    request = request.keyed(run_key or fresh_run_key(request))
    flow_runs: list[str] = []
    outcome: CollectionOutcome | None = None
    opened = False
    try:
        # Preflight, before anything is written: the suite and its templates, the policy
        # spec, the sandbox (a probe jail), the database (schema, writable), the object
        # store (writable), the run key's lock (held until the collection closes); then
        # Prefect's API (the shared local server is started if needed). The flow runs on
        # this collection: it plans, opens and locks nothing again.
        with open_collection(request, settings, preflight=True) as collection:
            opened = True
            apply_prefect_settings(settings.prefect)
            from prefect.client.schemas.objects import FlowRun, State

            from flows.collect import collect_episodes
            from flows.qc import GateOptions

            console_logs_without_tracebacks()  # the flow run's log in the API keeps them

            def remember(flow: Any, flow_run: FlowRun, state: State[Any]) -> None:
                flow_runs.append(str(flow_run.id))

            flow = collect_episodes.with_options(on_running=[remember])

            def stopping(signum: int) -> None:
                err.print(
                    f"{signal.Signals(signum).name}: stopping; saving the finished episodes "
                    "(again to abandon)",
                    highlight=False,
                )

            if run_key is None:
                # A manual run never joins another one: it gets a key of its own, said
                # before it starts (after the checks, which write nothing) so it can be
                # resumed.
                err.print(
                    f"run key {collection.run_key} (new; resume it with --run-key "
                    f"{collection.run_key})",
                    highlight=False,
                    markup=False,
                )
            try:
                with episode_progress(
                    collection.stored_episodes,
                    collection.plan.total,
                    console=err,
                    enabled=not as_json,
                ):
                    result = run_interruptibly(
                        lambda: collection.lend(
                            flow(
                                request=request,
                                shards=shards,
                                shard_deployment=shard_deployment,
                                gate=gate,
                                gate_options=GateOptions(trigger="none"),
                            )
                        ),
                        on_signal=stopping,
                        on_abandon=lambda signum: err.print(
                            _abandoned(collection, flow_runs, signum, settings),
                            highlight=False,
                            markup=False,
                        ),
                        stop_timeout_s=settings.prefect.stop_timeout_s,
                    )
            except Interrupted:
                outcome = collection.outcome()
                raise  # the collection records the run `interrupted` as it closes
            outcome = collection.outcome(result)
    except Interrupted as stop:
        assert outcome is not None
        err.print(_interrupted(outcome, flow_runs, stop), highlight=False, markup=False)
        raise typer.Exit(code=stop.exit_code) from None
    except Exception as e:
        reason = _database_lost(e) if opened else None
        if reason is None:
            raise
        err.print(
            f"the database failed mid-run ({reason}); the episodes it stored are kept. "
            f"When it answers again, resume with: {_resume_command(str(request.run_key))}",
            highlight=False,
            markup=False,
        )
        raise typer.Exit(code=EXIT_RERUN) from None
    assert outcome is not None and outcome.result is not None
    _print_result(outcome.result, as_json=as_json)
    line = _rerun_line(outcome)
    if line:
        err.print(line, highlight=False, markup=False)
        raise typer.Exit(code=EXIT_RERUN)


def _database_lost(error: BaseException) -> str | None:
    """The one-line reason when `error` (or what it was raised from) is the database
    failing (gone, unreachable, a statement or lock deadline): an infrastructure failure,
    never the agent's nor the user's input. None for anything else."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    from storage.errors import DatabaseUnavailable

    seen: set[int] = set()
    cause: BaseException | None = error
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, OperationalError | InterfaceError):
            text = str(cause.orig or cause).strip()
            return reason_line(text) if text else type(cause).__name__
        if isinstance(cause, DatabaseUnavailable):
            return reason_line(cause.user_message())
        cause = cause.__cause__ or cause.__context__
    return None


def _print_result(result: CollectResult, *, as_json: bool) -> None:
    if as_json:
        typer.echo(
            result.model_dump_json(
                include={
                    "run_id",
                    "run_key",
                    "planned",
                    "episodes",
                    "executed",
                    "steps",
                    "executed_steps",
                    "by_status",
                    "success_rate",
                    "duration_s",
                }
            )
        )
    else:
        out.print(
            f"run [bold]{result.run_key}[/] ({result.run_id}): {result.episodes} of "
            f"{result.planned} episodes ({result.executed} run now), {result.steps} steps, "
            f"success rate {result.success_rate:.1%}, {result.duration_s:.1f} s; "
            f"by status {result.by_status}"
        )


def _resume_command(run_key: str) -> str:
    """This command line, with `--run-key` set, to resume the run."""
    args = sys.argv[1:]
    if "--run-key" not in args and not any(a.startswith("--run-key=") for a in args):
        args = [*args, "--run-key", run_key]
    return shlex.join(["epiflow", *args])


def _rerun_line(outcome: CollectionOutcome) -> str | None:
    """The last line when some episodes need a re-run: how many, why, and the command.
    Planned episodes never started (the run stopped early: its endpoint was down) count."""
    result = outcome.result
    if result is None:
        return None
    unstarted = max(0, result.planned - result.episodes)
    if not outcome.rerun and not unstarted:
        return None
    total = sum(n.count for n in outcome.rerun.values()) + unstarted
    why = [
        f"{n.count} {status}" + (f" ({n.reason})" if n.reason else "")
        for status, n in sorted(outcome.rerun.items())
    ]
    if unstarted:
        why.append(f"{unstarted} not started (the run stopped early)")
    return (
        f"{total} of {result.planned} episodes need a re-run: {'; '.join(why)}. Fix the "
        f"cause, then re-run to redo only them: {_resume_command(outcome.run_key)}"
    )


def _interrupted(outcome: CollectionOutcome, flow_runs: list[str], stop: Interrupted) -> str:
    """Mark the interrupted collection's flow run Cancelled and return the last line:
    what is stored and how to resume."""
    name = signal.Signals(stop.signum).name
    flow_run_id = flow_runs[0] if flow_runs else outcome.flow_run_id
    cancelled = _cancel_flow_run(flow_run_id, f"interrupted by {name}") if flow_run_id else None
    flow_note = f"; flow run {flow_run_id} {cancelled}" if flow_run_id else ""
    return (
        f"interrupted by {name}: run {outcome.run_key} has {outcome.stored} of "
        f"{outcome.planned} episodes stored{flow_note}. Resume with: "
        f"{_resume_command(outcome.run_key)}"
    )


ABANDON_WRITE_S = 5.0
"""Seconds an abandoned stop gives each of its last writes (the run's status, the flow
run's state): a database or API that does not answer in time is left as it is."""


def _bounded(what: Callable[[], T], timeout_s: float) -> T | None:
    """`what()` in a daemon thread, waited on for `timeout_s`: its value, or None when it
    failed or had not returned (a frozen server never holds the process)."""
    box: list[T] = []

    def run() -> None:
        with contextlib.suppress(Exception):
            box.append(what())

    thread = threading.Thread(target=run, name="epiflow-abandon", daemon=True)
    thread.start()
    thread.join(timeout_s)
    return box[0] if box else None


def _abandoned(
    collection: Collection, flow_runs: list[str], signum: int, settings: Settings
) -> str:
    """The last line of a stop that was abandoned (a second signal, or past
    EPIFLOW_PREFECT_STOP_TIMEOUT_S): the run marked `interrupted` and its flow run
    Cancelled when they answer in time; what is stored; how to resume."""
    name = signal.Signals(signum).name

    def mark() -> bool:
        collection.abandon()
        return True

    marked = _bounded(mark, ABANDON_WRITE_S)
    stored = _bounded(collection.stored_episodes, ABANDON_WRITE_S)
    flow_note = ""
    flow_run_id = flow_runs[0] if flow_runs else None
    if flow_run_id:
        state = _bounded(
            lambda: _cancel_flow_run(flow_run_id, f"interrupted by {name}"), ABANDON_WRITE_S
        )
        flow_note = f"; flow run {flow_run_id} {state or 'not marked Cancelled (no answer)'}"
    return (
        f"{name}: stop abandoned (in-flight episodes dropped; re-running redoes them): run "
        f"{collection.run_key} "
        + ("marked interrupted" if marked else "left as it was (the database did not answer)")
        + (f", {stored} of {collection.plan.total} episodes stored" if stored is not None else "")
        + f"{flow_note}. Resume with: {_resume_command(collection.run_key)}"
    )


def _cancel_flow_run(flow_run_id: str, message: str) -> str:
    """Mark the flow run Cancelled (the engine recorded a crash); returns what happened."""
    from prefect.client.orchestration import get_client
    from prefect.states import Cancelled

    try:
        with get_client(sync_client=True) as client:
            client.set_flow_run_state(flow_run_id, Cancelled(message=message), force=True)
    except Exception as e:  # the run is saved either way; say why the state is stale
        return f"not marked Cancelled ({type(e).__name__}: {reason_line(str(e), 120)})"
    return "marked Cancelled"


def show(
    episode_id: Annotated[str, typer.Argument(help="Episode id (uuid).")],
    full: Annotated[
        bool, typer.Option(help="Do not shorten long outputs (long lines are folded).")
    ] = False,
    raw: Annotated[
        bool, typer.Option(help="Print the stored trajectory object (JSON) unchanged.")
    ] = False,
) -> None:
    """Render one episode's trajectory readably in the terminal."""
    from cli.show import render_trajectory
    from storage.episodes import load_trajectory, trajectory_bytes

    with stores(load_settings()) as (engine, store):
        if raw:
            sys.stdout.buffer.write(trajectory_bytes(engine, store, _uuid(episode_id)) + b"\n")
            return
        trajectory = load_trajectory(engine, store, _uuid(episode_id))
    render_trajectory(trajectory, out, max_chars=None if full else 1200)


def export(
    run: Annotated[str, typer.Option(help="Run key or run id.")],
    fmt: Annotated[str, typer.Option("--format", help="atif, openai or parquet.")] = "atif",
    output: Annotated[
        Path | None, typer.Option("--out", help="Output file (default: stdout for JSON).")
    ] = None,
) -> None:
    """Export a run's trajectories as ATIF or OpenAI chat messages (JSON lines) or a parquet of steps."""
    from storage.exchange import export_run

    if fmt not in ("atif", "openai", "parquet"):
        raise typer.BadParameter("use atif, openai or parquet", param_hint="--format")
    if fmt == "parquet" and output is None:
        raise typer.BadParameter("parquet needs --out FILE", param_hint="--out")
    with stores(load_settings()) as (engine, store):
        try:
            n = export_run(engine, store, run, fmt, output or sys.stdout)
        except OSError as e:
            if e.filename is not None or output is None:
                raise
            # Name the output file in the one-line error (a full or read-only disk).
            raise OSError(e.errno, e.strerror, str(output)) from e
    err.print(
        f"exported {n} episode(s) of run {run} as {fmt}" + (f" to {output}" if output else "")
    )


def import_(
    file: Annotated[
        Path,
        typer.Argument(
            help="JSON or JSON-lines file of trajectories.", exists=True, dir_okay=False
        ),
    ],
    fmt: Annotated[str, typer.Option("--format", help="atif, openai or harbor-traces.")] = "atif",
    run_key: Annotated[
        str | None,
        typer.Option(
            help="Run the imported episodes join (default: an epiflow export's own run; "
            "import:atif, import:openai or import:harbor-traces for foreign files)."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Import trajectories (ATIF v1.0-v1.8, OpenAI chat messages, or Harbor's
    *.traces.json: one episode per trial) into the database and object store. Every
    document is validated first; a file imported again changes nothing."""
    from storage.exchange import IMPORT_FORMATS, import_file

    if fmt not in IMPORT_FORMATS:
        raise typer.BadParameter("use atif, openai or harbor-traces", param_hint="--format")
    with stores(load_settings(), check_objects=True) as (engine, store):
        report = import_file(engine, store, file, fmt, run_key=run_key)
    if as_json:
        typer.echo(report.model_dump_json())
    else:
        out.print(report.summary(), markup=False, highlight=False)


def replay(
    episode_id: Annotated[str, typer.Argument(help="Episode id (uuid).")],
    as_json: JsonFlag = False,
) -> None:
    """Re-execute an episode's recorded tool calls in a fresh jail and compare observations."""
    import asyncio

    from collection.replay import replay_episode

    settings = load_settings()
    with stores(settings) as (engine, store):
        result = asyncio.run(replay_episode(engine, store, _uuid(episode_id), settings=settings))
    payload: dict[str, Any] = result.model_dump(mode="json")
    if as_json:
        typer.echo(json.dumps(payload))
    else:
        div = result.first_divergence
        out.print(
            f"episode {result.episode_id}: {result.identical_steps}/{result.steps} steps identical"
            + (f"; first divergence at step {div['step']}: {div['field']}" if div else "")
        )


def _uuid(text: str) -> uuid.UUID:
    try:
        return uuid.UUID(text)
    except ValueError as e:
        raise typer.BadParameter(f"{text!r} is not an episode id (a uuid)") from e


def register(app: typer.Typer) -> None:
    """Mount these commands on the top-level CLI."""
    app.command("collect")(collect)
    app.command("show")(show)
    app.command("export")(export)
    app.command("import")(import_)
    app.command("replay")(replay)
