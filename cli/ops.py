"""CLI commands for the rest of the loop: qc, train, evaluate, serve."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Annotated

import typer

from cli.stores import load_settings, stores
from cli.terminal import TerminalConsole

if TYPE_CHECKING:
    from pydantic import BaseModel

out = TerminalConsole(soft_wrap=True)
JsonFlag = Annotated[bool, typer.Option("--json", help="Print JSON on stdout.")]


def _prefect() -> None:
    from orchestration.prefect import apply_prefect_settings

    apply_prefect_settings(load_settings().prefect)


def _print(result: BaseModel, keys: tuple[str, ...], as_json: bool) -> None:
    dumped = result.model_dump(mode="json")
    shown = {k: dumped.get(k) for k in keys}
    if as_json:
        typer.echo(json.dumps(shown, default=str))
    else:
        out.print("  ".join(f"[bold]{k}[/] {v}" for k, v in shown.items()))


def qc(
    run: Annotated[str, typer.Option(help="Run key or run id to gate.")],
    grm: Annotated[
        bool, typer.Option(help="Also score with the LLM judge (EPIFLOW_GRM_*).")
    ] = False,
    trigger: Annotated[str, typer.Option(help="deployment, inline or none.")] = "deployment",
    threshold: Annotated[
        float | None, typer.Option(help="Training trigger volume (default from settings).")
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run the quality gate over a collection run (the `qc-gate` flow)."""
    import asyncio

    _prefect()
    from flows.qc import TRIGGER_MODES, qc_gate

    if trigger not in TRIGGER_MODES:
        raise typer.BadParameter(f"use one of {', '.join(TRIGGER_MODES)}", param_hint="--trigger")
    result = asyncio.run(qc_gate(run=run, grm=grm, trigger=trigger, training_threshold=threshold))
    summary = result.summary()
    if as_json:
        typer.echo(json.dumps(summary))
    else:
        out.print("  ".join(f"[bold]{k}[/] {v}" for k, v in summary.items()))


def train(
    algo: Annotated[
        str,
        typer.Option(
            help="sft, dpo, kto or grpo (online RL over whole episodes in the sandbox, on "
            "the tasks of a grpo snapshot: --from-run builds one)."
        ),
    ] = "sft",
    dataset: Annotated[str | None, typer.Option(help="Snapshot (dataset) id to train on.")] = None,
    from_run: Annotated[
        str | None, typer.Option(help="Build the snapshot from this run (key or id).")
    ] = None,
    qc_run: Annotated[
        list[str] | None,
        typer.Option(
            help="Build the snapshot from the run this gate judged, using its verdicts; "
            "repeat it for several gates (an episode several judged counts once, with its "
            "latest verdict)."
        ),
    ] = None,
    base_checkpoint: Annotated[
        str | None, typer.Option(help="Checkpoint to start from (default: newest base model).")
    ] = None,
    max_steps: Annotated[
        int | None, typer.Option(min=1, help="Optimizer steps (default from settings).")
    ] = None,
    templates: Annotated[
        str | None,
        typer.Option(help="grpo: comma-separated templates of the snapshot's tasks to train on."),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Train a checkpoint with TRL (the `train` flow)."""

    if sum(bool(x) for x in (dataset, from_run, qc_run)) != 1:
        raise typer.BadParameter("give exactly one of --dataset, --from-run and --qc-run")
    if algo not in ("sft", "dpo", "kto", "grpo"):
        raise typer.BadParameter("use sft, dpo, kto or grpo", param_hint="--algo")
    if algo == "grpo" and base_checkpoint:
        _check_grpo_base(base_checkpoint)
    _prefect()
    from cli.interrupts import Interrupted, run_interruptibly
    from flows.train import train as train_flow
    from training.trainers import Algo

    # Ctrl-C / SIGTERM cancel the flow: training stops at its next log event, its
    # `training_run` is closed failed and its work folder (model copies) removed.
    try:
        result = run_interruptibly(
            lambda: train_flow(
                algo=Algo(algo),
                dataset=dataset,
                from_run=from_run,
                qc_run=None if not qc_run else qc_run[0] if len(qc_run) == 1 else qc_run,
                base_checkpoint=base_checkpoint,
                max_steps=max_steps,
                templates=[t.strip() for t in templates.split(",") if t.strip()]
                if templates
                else None,
            )
        )
    except Interrupted as stop:
        typer.echo(
            f"{stop}: training stopped, its training_run marked failed and its work folder "
            "removed; run the command again to train",
            err=True,
        )
        raise typer.Exit(stop.exit_code) from stop
    _print(
        result,
        (
            "training_run_id",
            "checkpoint_id",
            "dataset_id",
            "algo",
            "steps",
            "train_loss",
            "tokens_per_s",
        ),
        as_json,
    )


def _check_grpo_base(base_checkpoint: str) -> None:
    """Refuse, before the flow starts, a GRPO base whose chat template cannot render the
    protocol (`collection.grpo_training.check_base_checkpoint`; the flow checks again)."""
    import uuid

    from collection.grpo_training import check_base_checkpoint
    from core.scratch import scratch_dir

    try:
        checkpoint = uuid.UUID(base_checkpoint)
    except ValueError as e:
        raise typer.BadParameter("not a checkpoint id", param_hint="--base-checkpoint") from e
    with stores(load_settings()) as (engine, store), scratch_dir("epiflow-grpo-base-") as work:
        check_base_checkpoint(engine, store, checkpoint, work)


def evaluate(
    checkpoint: Annotated[str, typer.Option(help="Checkpoint id.")],
    instances: Annotated[int, typer.Option(min=1, help="Held-out instances per template.")] = 2,
    templates: Annotated[
        str | None, typer.Option(help="Comma-separated templates (default: all).")
    ] = None,
    max_steps: Annotated[int, typer.Option(min=1, help="Turns per episode.")] = 8,
    promote: Annotated[
        str | None,
        typer.Option(
            "--promote",
            metavar="ALIAS",
            help="Compare with ALIAS's champion (the base while it is unset) and promote the "
            "checkpoint when the promotion rule says so.",
        ),
    ] = None,
    as_json: JsonFlag = False,
) -> None:
    """Run a checkpoint as a policy on held-out tasks in real sandboxes (the `evaluate` flow);
    with `--promote ALIAS`, then decide its promotion and print the decision's line."""
    import asyncio

    _prefect()
    from flows.evaluate import evaluate as evaluate_flow

    chosen = [t.strip() for t in templates.split(",") if t.strip()] if templates else None
    result = asyncio.run(
        evaluate_flow(
            checkpoint=checkpoint,
            instances=instances,
            templates=chosen,
            max_steps=max_steps,
            promote_alias=promote,
        )
    )
    keys = ("completion_rate", "avg_steps", "tool_failure_rate")
    _print(result, keys + (("promotion",) if promote and as_json else ()), as_json)
    if result.promotion is not None and not as_json:
        typer.echo(result.promotion.line())


def serve() -> None:
    """Serve the deployments (nightly-collect, nightly-champion, qc-gate, train, evaluate, shard)
    in this process.

    They appear in the Prefect UI with their schedules; runs execute here, no work pool
    needed. First sets up epiflow's automations (`epiflow prefect setup`): crashed runs
    are detected and nightly ones started again.
    """
    import asyncio

    settings = load_settings()
    _prefect()
    from prefect import serve as prefect_serve

    from flows.deployments import runner_deployments
    from orchestration.automations import ensure_automations

    report = asyncio.run(ensure_automations(settings.prefect))
    out.print(f"Prefect automations: {report.line()}", highlight=False)
    prefect_serve(*runner_deployments())


def register(app: typer.Typer) -> None:
    app.command("qc")(qc)
    app.command("train")(train)
    app.command("evaluate")(evaluate)
    app.command("serve")(serve)
