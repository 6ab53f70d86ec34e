"""`epiflow report`: one collection run as a self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from config.settings import load_settings


def report(
    run: Annotated[str, typer.Option(help="Run key or run id.")],
    output: Annotated[
        Path | None,
        typer.Option(
            "--out",
            dir_okay=False,
            help="HTML file to write (default: ./epiflow-report-<run_key>.html).",
        ),
    ] = None,
    max_chars: Annotated[
        int,
        typer.Option(
            min=0, help="Cut each long text block (model output, observation) here; 0 shows all."
        ),
    ] = 4000,
    expand: Annotated[
        bool, typer.Option(help="Open every episode (for printing or saving as PDF).")
    ] = False,
) -> None:
    """Write an HTML report of a collection run (status mix, charts, tools, templates,
    every trajectory with its gate verdict and judge deductions) and print its path."""
    from cli.stores import stores
    from reports.gather import default_report_path, gather_report
    from reports.html import render_report

    with stores(load_settings()) as (engine, store):
        gathered = gather_report(engine, store, run)
    page = render_report(gathered, max_chars=max_chars or None, expand=expand)
    target = output or default_report_path(gathered.run.run_key)
    try:
        target.write_text(page, encoding="utf-8")
    except OSError as e:
        raise typer.BadParameter(
            f"cannot write {target}: {e.strerror or e}", param_hint="--out"
        ) from e
    typer.echo(str(target))


def register(app: typer.Typer) -> None:
    """Mount `report` on the top-level CLI."""
    app.command("report")(report)
