"""`epiflow report`: one collection run as a self-contained HTML page."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from cli.stores import load_settings


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
    page_size: Annotated[
        int,
        typer.Option(
            min=1,
            help="Episodes per page: a larger run gets an overview page plus one page per "
            "this many episodes beside it (<out>-p0001.html, …).",
        ),
    ] = 200,
    expand: Annotated[
        bool, typer.Option(help="Open every episode (for printing or saving as PDF).")
    ] = False,
    workers: Annotated[
        int,
        typer.Option(min=1, help="Processes rendering episode pages (local object directory)."),
    ] = 1,
) -> None:
    """Write an HTML report of a collection run (status mix, charts, tools, templates,
    every trajectory with its gate verdict and judge deductions) and print its path; a run
    of more than --page-size episodes gets its episodes on pages beside it."""
    from cli.stores import stores
    from reports.pages import write_report

    with stores(load_settings()) as (engine, store):
        try:
            files = write_report(
                engine,
                store,
                run,
                output,
                page_size=page_size,
                max_chars=max_chars or None,
                expand=expand,
                workers=workers,
            )
        except OSError as e:
            where = e.filename or output
            raise typer.BadParameter(
                f"cannot write {where}: {e.strerror or e}", param_hint="--out"
            ) from e
    typer.echo(str(files[0]))
    if len(files) > 1:
        typer.echo(f"{len(files) - 1} episode page(s) beside it", err=True)


def register(app: typer.Typer) -> None:
    """Mount `report` on the top-level CLI."""
    app.command("report")(report)
