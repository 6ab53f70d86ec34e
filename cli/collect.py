"""CLI commands around collected episodes: collect, show, export, import, replay."""

from __future__ import annotations

import asyncio
import json
import sys
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from cli.stores import stores
from config.settings import load_settings

err = Console(stderr=True, soft_wrap=True)
out = Console(soft_wrap=True)

JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]


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
        str | None, typer.Option(help="Run key; re-running a key resumes it.")
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
    """Collect episodes in sandboxes through the `collect-episodes` Prefect flow."""
    from cli.progress import episode_progress
    from collection.plan import plan_collection
    from collection.request import CollectRequest, fresh_run_key
    from collection.runner import open_collection
    from config.prefect import apply_prefect_settings

    settings = load_settings()
    apply_prefect_settings(settings.prefect)
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
    # Everything that can be checked here is, before Prefect starts: the suite and its
    # templates, the policy spec, the database schema and the object store.
    plan = plan_collection(request, settings.suites)
    preflight = open_collection(plan, settings)
    asyncio.run(preflight.policy.aclose())

    from flows.collect import collect_episodes
    from flows.qc import GateOptions

    try:
        with episode_progress(
            preflight.engine, preflight.run_id, plan.total, console=err, enabled=not as_json
        ):
            result = asyncio.run(
                collect_episodes(
                    request=request,
                    shards=shards,
                    shard_deployment=shard_deployment,
                    gate=gate,
                    gate_options=GateOptions(trigger="none"),
                )
            )
    finally:
        preflight.engine.dispose()
    if as_json:
        typer.echo(
            result.model_dump_json(
                include={
                    "run_id",
                    "run_key",
                    "episodes",
                    "steps",
                    "by_status",
                    "success_rate",
                    "duration_s",
                }
            )
        )
    else:
        out.print(
            f"run [bold]{result.run_key}[/] ({result.run_id}): {result.episodes} episodes "
            f"({result.executed} run now), success rate {result.success_rate:.1%}, "
            f"{result.duration_s:.1f} s; by status {result.by_status}"
        )


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
        n = export_run(engine, store, run, fmt, output or sys.stdout)
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
    fmt: Annotated[str, typer.Option("--format", help="atif or openai.")] = "atif",
    run_key: Annotated[
        str | None,
        typer.Option(
            help="Run the imported episodes join (default: an epiflow export's own run; "
            "import:atif or import:openai for foreign files)."
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Import trajectories (ATIF v1.0-v1.5 or OpenAI chat messages) into the database and
    object store. Every document is validated first; a file imported again changes nothing."""
    from storage.exchange import IMPORT_FORMATS, import_file

    if fmt not in IMPORT_FORMATS:
        raise typer.BadParameter("use atif or openai", param_hint="--format")
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
