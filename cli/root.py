"""The `epiflow` typer app: the commands defined here (`db`, `prefect`, `demo`) and
`build_app`, which adds the command modules (`cli.collect`, `cli.suites`, …) a command
needs. Imported by `cli.app.main` when a command is not one of its fast paths.
"""

from __future__ import annotations

import importlib
import json
from typing import Annotated

import typer

from cli.app import _err, _out, _settings

REGISTERED: dict[str, tuple[str, ...]] = {
    "cli.collect": ("collect", "show", "export", "import", "replay"),
    "cli.ops": ("qc", "train", "evaluate", "serve"),
    "cli.report": ("report",),
}
"""Command modules with a `register(app)`, and the top-level commands each adds."""
GROUPS: dict[str, str] = {
    "suites": "cli.suites",
    "dataset": "cli.dataset",
    "protocol": "cli.protocol",
    "sandbox": "cli.sandbox",
    "models": "cli.models",
    "env": "cli.env",
}
"""Command groups (a module's own `app`), by name."""
# A command imports only its own module (`epiflow protocol parse` never imports the
# collection stack): `build_app` adds just the module that owns it. `epiflow --help` and
# an unknown name add every module, so the listing and "no such command" stay whole.

app = typer.Typer(
    name="epiflow",
    help="Agent-training data platform: sandboxed episodes, QC, training, evaluation.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
"""The commands defined here (`db`, `prefect`, `demo`); `build_app` adds the modules."""
db_app = typer.Typer(
    help="Database schema (Alembic): upgrade, downgrade, current.", no_args_is_help=True
)
app.add_typer(db_app, name="db")
prefect_app = typer.Typer(
    help="The shared local Prefect server (used when EPIFLOW_PREFECT_API_URL is unset).",
    no_args_is_help=True,
)
app.add_typer(prefect_app, name="prefect")
_added: set[str] = set()


def build_app(command: str | None = None) -> typer.Typer:
    """The `epiflow` app with the module that owns `command` added, or every module
    (`None`, or a name no module owns). Adding is idempotent."""
    owners = [m for m, names in REGISTERED.items() if command in names]
    groups = [command] if command in GROUPS else []
    if not owners and not groups:
        owners, groups = list(REGISTERED), list(GROUPS)
    for module in owners:
        if module not in _added:
            importlib.import_module(module).register(app)
            _added.add(module)
    for name in groups:
        if name not in _added:
            app.add_typer(importlib.import_module(GROUPS[name]).app, name=name)
            _added.add(name)
    return app


def command_of(argv: list[str]) -> str | None:
    """The first argument that is not an option: the command asked for, if any."""
    return next((a for a in argv if not a.startswith("-")), None)


@db_app.command("upgrade")
def db_upgrade(revision: Annotated[str, typer.Option(help="Target revision.")] = "head") -> None:
    """Upgrade the database schema (creates it on an empty database)."""
    from storage import migrate
    from storage.db import make_engine

    settings = _settings()
    engine = make_engine(settings.database)
    before = migrate.current_revision(engine)
    after = migrate.upgrade(engine, revision)
    _out().print(f"database {settings.database.redacted_url()}: {before or 'empty'} -> {after}")


@db_app.command("downgrade")
def db_downgrade(
    revision: Annotated[
        str, typer.Option(help="Target revision (`base` empties the schema).")
    ] = "-1",
) -> None:
    """Downgrade the database schema."""
    from storage import migrate
    from storage.db import make_engine

    settings = _settings()
    engine = make_engine(settings.database)
    before = migrate.current_revision(engine)
    after = migrate.downgrade(engine, revision)
    _out().print(
        f"database {settings.database.redacted_url()}: {before or 'empty'} -> {after or 'empty'}"
    )


@db_app.command("current")
def db_current(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the database's schema revision and the code's."""
    from storage import migrate
    from storage.db import make_engine

    settings = _settings()
    engine = make_engine(settings.database)
    current = migrate.current_revision(engine)
    head = migrate.head_revision()
    if as_json:
        typer.echo(json.dumps({"current": current, "head": head, "up_to_date": current == head}))
    else:
        state = "up to date" if current == head else "behind: run `epiflow db upgrade`"
        _out().print(f"current {current or 'empty'}, head {head} ({state})")


@db_app.command("orphans")
def db_orphans(
    delete: Annotated[bool, typer.Option(help="Delete the orphaned objects.")] = False,
    fix: Annotated[
        bool,
        typer.Option(
            help="Mark `crashed` the training runs left `running` by dead processes of this "
            "host (and their GRPO rollout runs `interrupted`)."
        ),
    ] = False,
) -> None:
    """List (or delete) objects no row points at, rows whose object is gone, and training
    runs whose process died (`--fix` marks them crashed)."""
    from cli.terminal import neutralise
    from storage.db import make_engine
    from storage.migrate import ensure_current
    from storage.objects import make_object_store
    from storage.orphans import delete_orphans, list_orphans
    from training.registry import mark_crashed_training_runs

    settings = _settings()
    engine = make_engine(settings.database)
    ensure_current(engine)
    store = make_object_store(settings.objects)
    store.check()
    report = delete_orphans(engine, store) if delete else list_orphans(engine, store)
    crashed = mark_crashed_training_runs(engine, dry_run=not fix)
    for key in report.keys:
        typer.echo(neutralise(key))
    for m in report.missing:
        typer.echo(f"missing: {m.table} {neutralise(m.row)} -> {neutralise(m.key)}")
    for run_id in crashed:
        typer.echo(f"crashed: training_run {run_id}")
    _err().print(
        f"{len(report.keys)} orphaned object(s){' deleted' if delete else ''}, "
        f"{len(report.missing)} row(s) without their object, {len(crashed)} training "
        f"run(s) of dead processes{' marked crashed' if fix else ' (--fix marks them crashed)'}"
    )


@db_app.command("verify")
def db_verify(
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
) -> None:
    """Check every artifact row against its object (present, size, sha256); exit 1 when
    any disagrees."""
    from cli.terminal import neutralise
    from storage.db import make_engine
    from storage.migrate import ensure_current
    from storage.objects import make_object_store
    from storage.verify import verify_artifacts

    settings = _settings()
    engine = make_engine(settings.database)
    ensure_current(engine)
    store = make_object_store(settings.objects)
    store.check()
    report = verify_artifacts(engine, store)
    if as_json:
        typer.echo(report.model_dump_json())
    else:
        for p in report.problems:
            typer.echo(f"{neutralise(p.key)}: {p.problem}: {p.detail}")
        _err().print(
            f"{report.checked} artifact(s) checked, {len(report.problems)} disagree with "
            "their object"
        )
    if report.problems:
        raise typer.Exit(1)


@prefect_app.command("start")
def prefect_start() -> None:
    """Start the shared local server (or find it running) and print its UI address; it
    stops after EPIFLOW_PREFECT_LOCAL_IDLE_S without a command attached."""
    from orchestration.prefect_server import attach

    settings = _settings().prefect
    attached = attach(settings)
    verb = "started" if attached.started else "running"
    _out().print(
        f"local Prefect server {verb}: UI {attached.state.ui_url}, API {attached.state.api_url}; "
        f"it stops {settings.local_idle_s:g} s after the last command exits"
    )


@prefect_app.command("status")
def prefect_status(
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON.")] = False,
) -> None:
    """Show the shared local Prefect server of this Prefect home: URL, pid, attached commands
    (with EPIFLOW_PREFECT_API_URL set: whether that API answers)."""
    from dataclasses import asdict

    from orchestration.prefect_server import remote_status, status

    api_url = _settings().prefect.api_url
    found = remote_status(api_url) if api_url else status()
    if as_json:
        typer.echo(json.dumps(asdict(found)))
    elif found.remote:
        state = "answers" if found.healthy else "does not answer"
        _out().print(f"Prefect API {found.api_url} (EPIFLOW_PREFECT_API_URL) {state}")
    elif found.running:
        health = "healthy" if found.healthy else "not answering yet"
        _out().print(
            f"local Prefect server {found.api_url} (pid {found.pid}, {health}), "
            f"{found.leases} command(s) attached; UI: {found.api_url.removesuffix('/api') if found.api_url else ''}"
        )
    else:
        _out().print(f"no local Prefect server running ({found.directory})")


@prefect_app.command("stop")
def prefect_stop() -> None:
    """Stop the shared local Prefect server now (commands attached to it lose their API)."""
    from orchestration.prefect_server import stop

    stopped = stop()
    _out().print(
        "stopped the local Prefect server" if stopped else "no local Prefect server running"
    )


@prefect_app.command("setup")
def prefect_setup() -> None:
    """Create or update epiflow's automations in the Prefect API: silent flow runs marked
    Crashed, crashed nightly runs scheduled again, unconfirmed cancellations closed, and
    (with EPIFLOW_PREFECT_NOTIFY_WEBHOOK_URL) failed nightly runs posted to the webhook.
    `epiflow serve` runs it too."""
    import asyncio

    from orchestration.automations import ensure_automations
    from orchestration.prefect import apply_prefect_settings

    settings = _settings().prefect
    url = apply_prefect_settings(settings)
    report = asyncio.run(ensure_automations(settings))
    _out().print(f"Prefect automations at {url}: {report.line()}", highlight=False)


@prefect_app.command("yaml")
def prefect_yaml() -> None:
    """Print `prefect.yaml` (the work-pool deployments) as flows/deployments.py defines
    them: `epiflow prefect yaml > prefect.yaml`."""
    from flows.deployments import prefect_yaml as render

    typer.echo(render(), nl=False)


@app.command("demo")
def demo(
    as_json: Annotated[bool, typer.Option("--json", help="Print a JSON summary.")] = False,
) -> None:
    """Run the main job on embedded defaults and say where to look."""
    from cli.demo import run_demo

    summary = run_demo(_settings(), console=_err() if as_json else _out())
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
