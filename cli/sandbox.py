"""`epiflow sandbox run`: one command in a fresh jail, for debugging tasks and the sandbox.

Mounted by `cli.app` as `epiflow sandbox`. Settings are built here (the entry point).
A sandbox that cannot start, or a workspace that cannot be copied, is one line on
stderr and exit code 2; otherwise the exit code is the command's (124 on timeout,
128 + N when killed by signal N), with or without `--json`. An export that left files out
(past the file-count cap `max_tracked_files`, over the size cap, unsafe paths) says so in
one line on stderr, and under `"export"` in the JSON.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

if TYPE_CHECKING:
    from sandbox import SandboxSettings, SandboxSpec
    from sandbox.transfer import ExportReport
    from sandbox.types import CommandResult

# The sandbox and pydantic are imported by the functions that use them: `epiflow --help`
# lists this group without importing them.

app = typer.Typer(
    help="Sandbox: run one command in a fresh nsjail jail.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)


@app.callback()
def sandbox_commands() -> None:
    """Sandbox: run one command in a fresh nsjail jail."""


def spec_for(timeout_s: float, memory_mb: int, network: str) -> SandboxSpec:
    """A spec for one command: the defaults, with tmpfs sizes shrunk to fit a small memory."""
    from sandbox import SandboxSpec
    from sandbox.spec import MIN_PROCESS_MEMORY_MIB

    defaults = SandboxSpec()
    room = memory_mb - MIN_PROCESS_MEMORY_MIB
    workspace = min(defaults.workspace_mib, max(1, room // 2))
    tmpfs = min(defaults.tmpfs_mib, max(1, room // 4))
    hard = max(defaults.hard_timeout_s, timeout_s + 60)
    return SandboxSpec(
        memory_mib=memory_mb,
        workspace_mib=workspace,
        tmpfs_mib=tmpfs,
        network=network,  # validated by the spec
        call_timeout_s=timeout_s,
        max_call_timeout_s=max(defaults.max_call_timeout_s, timeout_s),
        soft_timeout_s=hard - 1,
        hard_timeout_s=hard,
    )


def result_json(result: CommandResult) -> dict[str, Any]:
    """The printed record: output decoded as UTF-8 (invalid bytes replaced)."""
    return {
        "exit_code": result.exit_code,
        "signal": result.signal,
        "timed_out": result.timed_out,
        "stdout": result.stdout.decode("utf-8", errors="replace"),
        "stderr": result.stderr.decode("utf-8", errors="replace"),
        "duration_ms": round(result.duration_ms, 3),
        "truncated": result.stdout_truncated or result.stderr_truncated,
    }


def exit_code_of(result: CommandResult) -> int:
    """The CLI's exit code for `result`, shell-style."""
    if result.timed_out:
        return 124
    if result.signal is not None:
        return 128 + result.signal
    return result.exit_code if result.exit_code is not None else 1


async def run_once(
    spec: SandboxSpec,
    argv: list[str],
    *,
    workspace: Path | None,
    export: Path | None,
    settings: SandboxSettings,
) -> tuple[CommandResult, ExportReport | None]:
    """Run `argv` in a fresh jail (workspace copied in, outputs exported); returns its
    result and what the export copied (None without `export`)."""
    from sandbox import files_from_dir, open_sandbox

    files = files_from_dir(workspace, max_bytes=settings.populate_max_bytes) if workspace else None
    report = None
    async with await open_sandbox(spec, files=files, settings=settings) as box:
        result = await box.exec(argv)
        if export is not None:
            report = await box.export(export)
    return result, report


def export_line(report: ExportReport, dest: Path, settings: SandboxSettings) -> str | None:
    """One line when the export left files out (file-count cap, size cap, unsafe or
    unreadable paths); None when it copied everything."""
    if not report.left_out and not report.skipped:
        return None
    parts = []
    if report.left_out:
        parts.append(
            f"{report.left_out} past the file-count cap "
            f"(EPIFLOW_SANDBOX_MAX_TRACKED_FILES={settings.max_tracked_files})"
        )
    over = sum(1 for reason in report.skipped.values() if reason == "over_size_cap")
    if over:
        parts.append(
            f"{over} over the size cap (EPIFLOW_SANDBOX_EXPORT_MAX_BYTES={settings.export_max_bytes})"
        )
    other = len(report.skipped) - over
    if other:
        parts.append(f"{other} unsafe or unreadable")
    return (
        f"export to {dest}: {len(report.files)} file(s) copied, "
        f"{report.left_out + len(report.skipped)} left out: {', '.join(parts)}"
    )


@app.command(
    "run",
    context_settings={"allow_interspersed_args": False},
)
def run(
    command: Annotated[list[str], typer.Argument(help="The command and its arguments (after --).")],
    timeout: Annotated[
        float, typer.Option("--timeout", help="Per-command timeout, seconds.")
    ] = 30.0,
    memory_mb: Annotated[int, typer.Option("--memory-mb", help="Memory of the jail, MiB.")] = 4096,
    network: Annotated[str, typer.Option("--network", help="none | loopback.")] = "none",
    workspace: Annotated[
        Path | None, typer.Option("--workspace", help="Copy this directory into /workspace.")
    ] = None,
    export: Annotated[
        Path | None, typer.Option("--export", help="Copy /workspace's files here afterwards.")
    ] = None,
    as_json: Annotated[bool, typer.Option("--json", help="Print one JSON object.")] = False,
) -> None:
    """Run one command in a fresh jail, in /workspace, and print its result."""
    import asyncio

    from pydantic import ValidationError

    from sandbox import SandboxError, SandboxSettings

    try:
        spec = spec_for(timeout, memory_mb, network)
        settings = SandboxSettings()
        result, report = asyncio.run(
            run_once(spec, command, workspace=workspace, export=export, settings=settings)
        )
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(part) for part in first["loc"]) or "spec"
        typer.echo(f"error: invalid sandbox option: {where}: {first['msg']}", err=True)
        raise typer.Exit(code=2) from e
    except (SandboxError, ValueError) as e:
        typer.echo(f"error: {e}", err=True)
        raise typer.Exit(code=2) from e
    if as_json:
        record = result_json(result)
        if report is not None:
            record["export"] = {
                "files": len(report.files),
                "bytes": report.bytes,
                "left_out": report.left_out,
                "skipped": len(report.skipped),
                "truncated": report.truncated,
            }
        typer.echo(json.dumps(record, ensure_ascii=False))
    else:
        sys.stdout.buffer.write(result.stdout)
        sys.stdout.buffer.flush()
        sys.stderr.buffer.write(result.stderr)
        sys.stderr.buffer.flush()
    # Never silent: what the export left out is the last line on stderr.
    line = export_line(report, export, settings) if report is not None and export else None
    if line:
        typer.echo(f"warning: {line}", err=True)
    raise typer.Exit(code=exit_code_of(result))
