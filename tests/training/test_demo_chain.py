"""The demo's chain teaches the model: trained completion beats the base on held-out tasks.

Everything real: oracle and noisy episodes collected in nsjail, both gated by the GX
suites, one SFT snapshot from what the gates admitted (the demo recipe's compact prompt),
a base model built for it (words tokenizer, copy warm-up), SFT on the `demo` recipe, and
both models evaluated with the `hf:` policy in real sandboxes on held-out instances
(seeds disjoint from training). These are the functions the demo's flows run: the
collect flows call `collect_in_process`'s steps, the qc-gate flow `run_gate` and
`write_qc_run`, the train flow (`recipe="demo"`, both gate runs) `build_snapshot`,
`prepare_base_for_snapshot` and `train_checkpoint`, the evaluate flow
`run_model_episodes` on `heldout_instances`.

The assertion is relative (trained > base), never a fixed rate: the demo's budget is
wall time on a shared machine.
"""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent.trajectory import utcnow
from collection.request import CollectRequest
from collection.runner import collect_in_process
from expectations.gate import run_gate
from expectations.settings import QcConfig
from scoring.rule_judge import rule_judgement
from storage.objects import LocalObjectStore
from storage.qc import write_qc_run
from suites.registry import load_suite
from training.evaluation import evaluation_metrics, run_model_episodes
from training.pipeline import prepare_base_for_snapshot, train_checkpoint
from training.recipes import get_recipe
from training.registry import fetch_checkpoint
from training.snapshots import build_snapshot, select_episodes


def _gate(engine: Engine, store: LocalObjectStore, run_id: uuid.UUID) -> uuid.UUID:
    config = QcConfig.from_env()
    started = utcnow()
    trajectories = [e.trajectory for e in select_episodes(engine, store, run_ids=[run_id])]
    rules = [rule_judgement(t, config.judge) for t in trajectories]
    report = run_gate(trajectories, config=config, rule_judgements=rules)
    return write_qc_run(
        engine,
        run_id=run_id,
        report=report,
        judgements=rules,
        docs_key=None,
        started_at=started,
    )


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_demo_chain_trained_beats_base_on_heldout(engine, store, tmp_path: Path) -> None:
    recipe = get_recipe("demo")
    settings = recipe.training_settings()
    runs = [
        asyncio.run(
            collect_in_process(
                CollectRequest(
                    run_key=f"demo-{policy}",
                    policy=policy,
                    tasks=tasks,
                    seed=seed,
                    concurrency=8,
                    templates=recipe.templates,
                ),
                engine=engine,
                store=store,
            )
        ).run_id
        for policy, tasks, seed in (
            ("scripted:oracle", recipe.oracle_tasks, 0),
            (recipe.noisy_policy, recipe.noisy_tasks, recipe.oracle_tasks),
        )
    ]
    qc_runs = [_gate(engine, store, run_id) for run_id in runs]
    snapshot = build_snapshot(
        engine,
        store,
        kind="sft",
        run_ids=runs,
        qc_run_id=qc_runs,
        prompt_style=settings.prompt_style,
    )
    assert snapshot.prompt_style == "compact" and snapshot.n_rows > recipe.oracle_tasks
    base_id = prepare_base_for_snapshot(
        engine, store, dataset_id=snapshot.id, work_dir=tmp_path / "base", settings=settings
    )
    outcome = train_checkpoint(
        engine,
        store,
        algo="sft",
        dataset_id=snapshot.id,
        work_dir=tmp_path / "train",
        settings=settings,
        base_checkpoint_id=base_id,
    )
    assert outcome.result.stopped_by_time

    heldout = load_suite("builtin").heldout_instances(recipe.heldout, templates=recipe.templates)

    def completion(checkpoint: uuid.UUID, name: str) -> float:
        model_dir = fetch_checkpoint(engine, store, checkpoint, tmp_path / name)
        trajectories = asyncio.run(
            run_model_episodes(
                model_dir,
                heldout,
                run_key=f"demo-eval-{name}",
                max_steps=recipe.eval_max_steps,
                max_new_tokens=recipe.eval_max_new_tokens,
            )
        )
        return evaluation_metrics(trajectories, heldout).completion_rate

    base = completion(base_id, "base")
    trained = completion(outcome.checkpoint_id, "trained")
    assert trained > base, f"trained completion {trained} did not beat the base's {base}"
