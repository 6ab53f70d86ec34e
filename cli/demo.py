"""`epiflow demo`: the nightly chain once, on embedded defaults, in a few minutes.

SQLite, a local object directory and the shared local Prefect server (unless EPIFLOW_* settings
say otherwise): collect with the noisy policy and fault injection, and with the oracle, on the
`demo` training recipe's templates (`training.recipes`) → QC gate of each → training
triggered at a demo threshold on what both gates admitted (the recipe: a small model built
for the data, a copy warm-up, SFT within a time budget) → evaluation of the checkpoint
against its base on held-out instances. Ends with base vs trained completion, where to
look, and what to run for the full loop (`bench/loop.py`). Never silent for long: a progress
line at least every 20 s (`core.progress`): the stage running, then training's steps, loss
and ETA and evaluation's episodes.
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
from config.settings import Settings
from core.progress import ProgressReporter
from models import run_id_for
from orchestration.prefect import apply_prefect_settings
from storage import migrate
from storage.db import make_engine
from storage.objects import make_object_store
from storage.run_reads import sample_episode

if TYPE_CHECKING:
    from flows.collect import CollectFlowResult
    from flows.evaluate import EvaluationResult
    from flows.qc import QcGateResult

DEMO_RECIPE = "demo"
"""`training.recipes` preset of the demo: templates, data sizes, model, budget, evaluation."""
DEMO_NOISY_TASKS = 5
"""Noisy instances per template collected with fault injection (failures to look at)."""
_QUIET = {
    "TQDM_DISABLE": "1",
    "HF_DATASETS_DISABLE_PROGRESS_BARS": "1",
    "TRANSFORMERS_VERBOSITY": "error",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}
DEMO_THRESHOLD = 5.0
"""Quality-weighted volume that triggers the demo's training (production default: 500)."""
FULL_LOOP = "python bench/loop.py --json"
"""What to run for the whole closed loop (bigger data, 12 minutes of training, iterations)."""


DEMO_STAGES = (
    "collect scripted:noisy",
    "QC gate noisy",
    "collect scripted:oracle",
    "QC gate oracle → train → evaluate",
)
"""The chain's stages, as the progress lines name them."""


async def _chain(
    key: str, stages: ProgressReporter
) -> tuple[CollectFlowResult, QcGateResult, QcGateResult, EvaluationResult | None]:
    from flows.collect import collect_episodes
    from flows.evaluate import EvaluationOptions
    from flows.qc import qc_gate
    from training.recipes import get_recipe

    recipe = get_recipe(DEMO_RECIPE)
    stages.update(0, running=DEMO_STAGES[0])
    # The noisy run with fault injection: what a real collection looks like, failures too.
    collected = await collect_episodes(
        request=CollectRequest(
            suite="builtin",
            policy=recipe.noisy_policy,
            tasks=DEMO_NOISY_TASKS,
            rollouts=1,
            concurrency=4,
            faults="light",
            run_key=key,
            templates=recipe.templates,
            seed=recipe.oracle_tasks,
        )
    )
    stages.update(1, force=True, running=DEMO_STAGES[1])
    noisy_gate = await qc_gate(run=key, trigger="none")
    stages.update(2, force=True, running=DEMO_STAGES[2])
    # The oracle run: the recipe's training data (instances disjoint from the noisy ones and
    # from the held-out ones); its gate triggers the training on both gates' admissions.
    oracle = await collect_episodes(
        request=CollectRequest(
            suite="builtin",
            policy="scripted:oracle",
            tasks=recipe.oracle_tasks,
            rollouts=1,
            concurrency=8,
            run_key=f"{key}-oracle",
            templates=recipe.templates,
        )
    )
    stages.update(3, force=True, running=DEMO_STAGES[3])
    gated = await qc_gate(
        run=oracle.run_key,
        trigger="inline",
        training_threshold=DEMO_THRESHOLD,
        train_recipe=recipe.name,
        train_with_qc_runs=[str(noisy_gate.qc_run_id)],
        # The trained checkpoint against its base (the previous checkpoint) on held-out
        # instances of the recipe's templates.
        evaluation=EvaluationOptions(
            instances=recipe.heldout,
            templates=recipe.templates,
            max_steps=recipe.eval_max_steps,
            max_new_tokens=recipe.eval_max_new_tokens,
        ),
    )
    stages.update(4, running=None)
    trained = gated.training.result if gated.training else None
    evaluation = trained.evaluation if trained is not None else None
    return collected, noisy_gate, gated, evaluation


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
    from training.recipes import get_recipe

    recipe = get_recipe(DEMO_RECIPE)
    templates = ", ".join(recipe.templates)
    console.print(
        f"[bold]2. collect → gate → train → evaluate[/] run {key}: scripted:noisy with light fault "
        f"injection and scripted:oracle on {templates} (recipe {recipe.name!r}; Prefect "
        f"API {prefect_api})"
    )
    # A line at least every PROGRESS_EVERY_S: the stage running and its time; training and
    # evaluation print their own (steps, loss, ETA; episodes), which quiet these meanwhile.
    with ProgressReporter(
        "demo",
        total=len(DEMO_STAGES),
        unit="stage",
        rate=False,
        emit=lambda line: console.print(line, markup=False, highlight=False),
    ) as stages:
        collected, noisy_gate, gated, evaluation = asyncio.run(_chain(key, stages))
    console.print(
        f"   collected {collected.episodes} noisy episodes ({collected.steps} steps), success "
        f"rate {collected.success_rate:.0%}, by status {collected.by_status}; "
        f"{recipe.oracle_tasks * len(recipe.templates)} oracle episodes"
    )
    for name, gate in (("noisy", noisy_gate), ("oracle", gated)):
        console.print(
            f"   QC {name}: batch {'passed' if gate.batch_passed else 'FAILED'}; keep {gate.keep}, "
            f"downweight {gate.downweight}, discard {gate.discard}; mean quality "
            f"{(gate.mean_quality or 0):.2f}; training triggered: {gate.triggered_training}"
        )
    training = gated.training.result if gated.training else None
    if training is not None:
        budget = " (its time budget)" if training.stopped_by_time else ""
        console.print(
            f"   trained {training.algo} for {training.steps} steps{budget} → checkpoint "
            f"{training.checkpoint_id}"
        )
    base_completion = (
        evaluation.previous.get("completion_rate")
        if evaluation is not None and evaluation.previous
        else None
    )
    if evaluation is not None:
        base = f"{base_completion:.0%}" if base_completion is not None else "-"
        console.print(
            f"   held-out evaluation ({recipe.heldout} unseen instances per template): completion "
            f"base {base} → trained {evaluation.completion_rate:.0%}; avg steps "
            f"{evaluation.avg_steps:.1f}, tool failure rate {evaluation.tool_failure_rate:.0%}"
        )
    console.print(
        f"   the full loop (more data, 12 min of training, expert iteration): {FULL_LOOP}"
    )

    run_id = run_id_for(key)
    success = sample_episode(engine, run_id, success=True)
    # A failure to look at: from the noisy run, else (every noisy episode recovered) from the
    # held-out evaluations, the trained model's first, then its base's.
    evaluated = [evaluation.checkpoint_id, evaluation.previous_checkpoint_id] if evaluation else []
    failure = next(
        (
            found
            for run in [run_id, *(run_id_for(f"eval-{c}") for c in evaluated if c)]
            if (found := sample_episode(engine, run, success=False))
        ),
        None,
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
            | {"base_completion_rate": base_completion, "templates": recipe.templates}
            if evaluation
            else None
        ),
        "full_loop": FULL_LOOP,
        "schema_revision": revision,
        "duration_s": round((utcnow() - started).total_seconds(), 1),
        "paths": paths,
    }
