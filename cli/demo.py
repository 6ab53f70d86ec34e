"""`epiflow demo`: the nightly chain once, on embedded defaults, in a few minutes.

SQLite, a local object directory and the shared local Prefect server (unless EPIFLOW_* settings
say otherwise): collect with the noisy policy and fault injection on the built-in suite →
QC gate → training triggered at a demo threshold (tiny local model, few steps) →
evaluation of the checkpoint on held-out tasks. Ends with where to look.
"""

from __future__ import annotations

import asyncio
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console

from agent.trajectory import utcnow
from collection.request import CollectRequest
from config.prefect import apply_prefect_settings
from config.settings import Settings
from models import run_id_for
from storage import migrate
from storage.db import make_engine
from storage.objects import make_object_store
from storage.runs import sample_episode

if TYPE_CHECKING:
    from flows.collect import CollectFlowResult
    from flows.evaluate import EvaluationResult
    from flows.qc import QcGateResult

DEMO_TEMPLATES = [
    "csv_to_json",
    "dir_tree",
    "config_update",
    "log_errors",
    "summary_stats",
    "merge_csv",
]
"""A spread of difficulties that keeps the demo within a few minutes on 2 cores."""
_QUIET = {
    "TQDM_DISABLE": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}
DEMO_THRESHOLD = 5.0
"""Quality-weighted volume that triggers the demo's training (production default: 500)."""
DEMO_TRAIN_STEPS = 30
"""Optimizer steps of the demo's SFT run on the tiny model."""


async def _chain(key: str) -> tuple[CollectFlowResult, QcGateResult, EvaluationResult | None]:
    from flows.collect import collect_episodes
    from flows.evaluate import EvaluationOptions
    from flows.qc import qc_gate

    collected = await collect_episodes(
        request=CollectRequest(
            suite="builtin",
            policy="scripted:noisy",
            tasks=2,
            rollouts=1,
            concurrency=4,
            faults="light",
            run_key=key,
            templates=DEMO_TEMPLATES,
        )
    )
    gated = await qc_gate(
        run=key,
        trigger="inline",
        training_threshold=DEMO_THRESHOLD,
        train_max_steps=DEMO_TRAIN_STEPS,
        # The triggered training is evaluated against its base on held-out instances.
        evaluation=EvaluationOptions(
            instances=1, templates=DEMO_TEMPLATES[:3], max_steps=3, max_new_tokens=96
        ),
    )
    trained = gated.training.result if gated.training else None
    evaluation = trained.evaluation if trained is not None else None
    return collected, gated, evaluation


def run_demo(settings: Settings, *, console: Console) -> dict[str, Any]:
    """Run the chain; print progress and where to look; return the JSON summary."""
    started = utcnow()
    # A demo reads best without library progress bars and INFO logs; users can override.
    for name, value in _QUIET.items():
        os.environ.setdefault(name, value)
    logging.getLogger("great_expectations").setLevel(logging.WARNING)
    prefect_api = apply_prefect_settings(settings.prefect)
    # Check both stores before writing anything, so a bad setting leaves nothing half-done.
    engine = make_engine(settings.database)
    store = make_object_store(settings.objects)
    store.check()
    before = migrate.current_revision(engine)
    revision = migrate.upgrade(engine)
    console.print(
        f"[bold]1. database[/] {settings.database.redacted_url()}: {before or 'empty'} -> {revision}"
    )
    key = f"demo-{started:%Y%m%dT%H%M%S}"
    console.print(
        f"[bold]2. collect → gate → train → evaluate[/] run {key}: scripted:noisy with light fault "
        f"injection on {len(DEMO_TEMPLATES)} built-in templates (Prefect "
        f"API {prefect_api})"
    )
    collected, gated, evaluation = asyncio.run(_chain(key))
    console.print(
        f"   collected {collected.episodes} episodes ({collected.steps} steps), success rate "
        f"{collected.success_rate:.0%}, by status {collected.by_status}"
    )
    console.print(
        f"   QC: batch {'passed' if gated.batch_passed else 'FAILED'}; keep {gated.keep}, "
        f"downweight {gated.downweight}, discard {gated.discard}; mean quality "
        f"{(gated.mean_quality or 0):.2f}; training triggered: {gated.triggered_training}"
    )
    training = gated.training.result if gated.training else None
    if training is not None:
        console.print(
            f"   trained {training.algo} for {training.steps} steps → checkpoint {training.checkpoint_id}"
        )
    if evaluation is not None:
        previous = evaluation.previous["completion_rate"] if evaluation.previous else "-"
        console.print(
            f"   evaluation on held-out tasks: completion {evaluation.completion_rate:.0%}, "
            f"avg steps {evaluation.avg_steps:.1f}, tool failure rate {evaluation.tool_failure_rate:.0%} "
            f"(previous checkpoint: {previous})"
        )

    run_id = run_id_for(key)
    success, failure = (
        sample_episode(engine, run_id, success=True),
        sample_episode(engine, run_id, success=False),
    )
    database = settings.database.redacted_url()
    sqlite_file = (
        str(Path(database.removeprefix("sqlite:///")).resolve())
        if settings.database.is_sqlite
        else None
    )
    docs = gated.docs_key
    docs_path = (
        str((settings.objects.local_root() / docs).resolve())
        if docs and not settings.objects.is_s3
        else docs
    )
    paths: dict[str, Any] = {
        "database": sqlite_file or database,
        "objects": store.location
        if settings.objects.is_s3
        else str(settings.objects.local_root().resolve()),
        "gx_data_docs": docs_path,
        "success_episode": success,
        "failure_episode": failure,
        "show_success": f"epiflow show {success}" if success else None,
        "show_failure": f"epiflow show {failure}" if failure else None,
        "report": f"epiflow report --run {key}",
        "prefect_ui": prefect_api.removesuffix("/api")
        if settings.prefect.api_url
        else "epiflow prefect start  # prints the shared local server's UI address",
    }
    console.print("\n[bold]Where to look[/]")
    console.print(
        f"  SQL:           sqlite3 {sqlite_file}" if sqlite_file else f"  SQL:           {database}"
    )
    console.print(
        "                 views: episode_summary, tool_failure_rates, quality_by_suite, training_lineage, reproducibility_by_suite"
    )
    console.print(f"  GX data docs:  {docs_path}")
    console.print(f"  a success:     {paths['show_success']}")
    console.print(f"  a failure:     {paths['show_failure']}")
    console.print(f"  HTML report:   {paths['report']}")
    console.print(f"  Prefect UI:    {paths['prefect_ui']}")
    engine.dispose()
    return {
        "run_key": key,
        "episodes": collected.episodes,
        "success_rate": collected.success_rate,
        "qc": gated.summary(),
        "training_run_id": str(training.training_run_id) if training else None,
        "checkpoint_id": str(training.checkpoint_id) if training else None,
        "evaluation": (
            evaluation.model_dump(
                mode="json",
                include={"completion_rate", "avg_steps", "tool_failure_rate", "previous", "delta"},
            )
            if evaluation
            else None
        ),
        "schema_revision": revision,
        "duration_s": round((utcnow() - started).total_seconds(), 1),
        "paths": paths,
    }
