"""`epiflow dataset export`: hand a dataset snapshot to someone (HF `datasets`, parquet, JSONL)."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Annotated

import typer

from cli.stores import load_settings

app = typer.Typer(help="Dataset snapshots (training data).", no_args_is_help=True)


@app.command("export")
def export(
    dataset_id: Annotated[str, typer.Argument(help="Snapshot (dataset) id.")],
    fmt: Annotated[
        str, typer.Option("--format", help="hf (a datasets directory), parquet or jsonl.")
    ] = "hf",
    out: Annotated[
        Path, typer.Option("--out", help="New or empty directory to write into.")
    ] = Path("dataset"),
    messages: Annotated[
        str,
        typer.Option(
            "--messages",
            help="Chats as `text` (the XML protocol in content, as trained) or `tool-calls` "
            "(TRL's tool-calling form: tool_calls, tool messages, a tools column).",
        ),
    ] = "text",
    as_json: Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")] = False,
) -> None:
    """Write a snapshot, checked against its sha256, as a Hugging Face `datasets` directory
    (`datasets.load_from_disk(DIR)`), its parquet file or JSON lines, with
    `epiflow_dataset.json` (id, kind, filter, counts, sha256) beside it. The `weight`
    column is the quality score: epiflow samples by it, plain TRL ignores it."""
    import json

    from cli.stores import stores
    from training.dataset_export import EXPORT_FORMATS, export_snapshot
    from training.snapshots import get_snapshot

    if fmt not in EXPORT_FORMATS:
        raise typer.BadParameter(f"use {', '.join(EXPORT_FORMATS)}", param_hint="--format")
    try:
        snapshot_id = uuid.UUID(dataset_id)
    except ValueError as e:
        raise typer.BadParameter(f"{dataset_id!r} is not a dataset id (a uuid)") from e
    with stores(load_settings()) as (engine, store):
        info = get_snapshot(engine, snapshot_id)
        files = export_snapshot(store, info, fmt, out, messages=messages)
    if as_json:
        typer.echo(
            json.dumps(
                {
                    "dataset_id": str(info.id),
                    "kind": info.kind.value,
                    "format": fmt,
                    "messages": messages,
                    "rows": info.n_rows,
                    "out": str(out),
                    "files": [str(f) for f in files],
                }
            )
        )
    else:
        typer.echo(f"dataset {info.id} ({info.kind.value}, {info.n_rows} rows) as {fmt} in {out}")
