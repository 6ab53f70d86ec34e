"""`epiflow env`: epiflow as the environment of another trainer.

`epiflow env serve` runs the OpenEnv-compatible server (`environment.server`) until
SIGTERM or Ctrl-C; `epiflow env rows` writes the dataset rows `EpiflowEnv.reset(**row)`
takes (one JSON object a line). Mounted by `cli.root` as `epiflow env`; the environment
stack is imported by the commands, not at load.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from pathlib import Path
from typing import Annotated, Any

import typer

app = typer.Typer(
    help="epiflow as an environment: an OpenEnv-compatible server, dataset rows for TRL.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)

TOKEN_ENV = "EPIFLOW_ENV_TOKEN"
"""The environment variable holding the server's bearer token."""


@app.callback()
def env_commands() -> None:
    """epiflow as an environment: an OpenEnv-compatible server, dataset rows for TRL."""


@app.command("serve")
def serve(
    host: Annotated[str, typer.Option(help="Address to bind (loopback by default).")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="Port.")] = 8000,
    suite: Annotated[str, typer.Option(help="Suite whose tasks sessions run.")] = "builtin",
    templates: Annotated[
        str | None, typer.Option(help="Comma-separated templates served (default: all).")
    ] = None,
    max_sessions: Annotated[
        int | None,
        typer.Option(
            help="Sessions open at once (default: the warm pool's size, EPIFLOW_SANDBOX_POOL_MAX_SIZE)."
        ),
    ] = None,
    idle_timeout: Annotated[
        float, typer.Option(help="Close a session silent this long, seconds.")
    ] = 300.0,
    run_key: Annotated[
        str | None, typer.Option(help="The collection run of every session (default: fresh).")
    ] = None,
    allow_remote: Annotated[
        bool, typer.Option(help="Allow a bind beyond loopback (needs a token).")
    ] = False,
    token: Annotated[
        str | None, typer.Option(help=f"Bearer token (default: ${TOKEN_ENV}).", show_default=False)
    ] = None,
) -> None:
    """Serve OpenEnv's protocol (WS /ws, /health, /schema, /metadata); every session is a
    stored episode of one collection run.

    The run opens before the port is bound: a run key held by another live process is one
    line naming the key and its holder, exit code 2, and no jail started."""
    import asyncio

    from config.settings import load_settings
    from environment.hub import HubConfig
    from environment.server import check_bind, serve

    token = token or os.environ.get(TOKEN_ENV) or None
    check_bind(host, token=token, allow_remote=allow_remote)
    settings = load_settings()
    key = run_key or f"env-{suite}-{uuid.uuid4().hex[:8]}"
    config = HubConfig(
        run_key=key,
        suite=suite,
        templates=[t for t in templates.split(",") if t] if templates else None,
        max_sessions=max_sessions or max(1, settings.sandbox.pool_max_size),
        idle_timeout_s=idle_timeout,
    )
    # uvicorn stops gracefully on SIGTERM/SIGINT while it serves, then re-raises the
    # signal to the handler it found: this one, so a graceful stop (sessions stored, no
    # jail) exits 0. A signal while the run opens stops the server as soon as it starts.
    stop_asked: list[int] = []
    stops = {
        sig: signal.signal(sig, lambda signum, _: stop_asked.append(signum))
        for sig in (signal.SIGTERM, signal.SIGINT)
    }

    def ready(server: Any) -> None:
        server.should_exit = bool(stop_asked)
        typer.echo(
            f"epiflow env: run {key}, ws://{host}:{port}/ws, at most {config.max_sessions} "
            "sessions",
            err=True,
        )

    try:
        asyncio.run(serve(config, settings, host=host, port=port, token=token, ready=ready))
    finally:
        for sig, handler in stops.items():
            signal.signal(sig, handler)
    typer.echo(f"epiflow env: run {key} stopped; its episodes are stored", err=True)


@app.command("rows")
def rows(
    output: Annotated[Path, typer.Option("--output", "-o", help="JSONL file to write.")],
    suite: Annotated[str, typer.Option(help="Suite.")] = "builtin",
    templates: Annotated[str | None, typer.Option(help="Comma-separated templates.")] = None,
    tasks: Annotated[int, typer.Option(help="Instances per template.")] = 1,
    seed: Annotated[int, typer.Option(help="First instance seed.")] = 0,
) -> None:
    """Write one dataset row per task instance: TRL's `prompt` and the task columns
    `EpiflowEnv.reset(**row)` reads (suite, template, instance_seed, task_id)."""
    from config.settings import load_settings
    from environment.trainer_env import dataset_rows

    chosen = [t for t in templates.split(",") if t] if templates else None
    settings = load_settings()
    written = dataset_rows(
        suite,
        templates=chosen,
        tasks=tasks,
        seed=seed,
        settings=settings.suites,
        sandbox=settings.sandbox,
    )
    output.write_text("".join(json.dumps(row) + "\n" for row in written))
    typer.echo(f"{len(written)} rows written to {output}", err=True)
