"""The closed loop through flows: collect → qc-gate (triggers training inline, once) →
train (tiny local model, TRL) → evaluate the checkpoint against its base in real
sandboxes; lineage in SQL; no run row left `running`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from collection.request import CollectRequest
from collection.runner import collect_in_process
from storage.objects import LocalObjectStore

TEMPLATES = ["csv_to_json", "dir_tree"]


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_gate_triggers_training_once_then_evaluate(
    prefect_harness: None, migrated_engine: Engine, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from flows.evaluate import EvaluationOptions
    from flows.qc import qc_gate

    monkeypatch.setenv(
        "EPIFLOW_DATABASE_URL", migrated_engine.url.render_as_string(hide_password=False)
    )
    monkeypatch.setenv("EPIFLOW_OBJECTS_URL", str(tmp_path / "objects"))
    monkeypatch.setenv("EPIFLOW_TRAINING_MAX_STEPS", "2")
    store = LocalObjectStore(tmp_path / "objects")
    request = CollectRequest(
        run_key="loop", tasks=2, rollouts=1, concurrency=4, templates=TEMPLATES
    )
    asyncio.run(collect_in_process(request, engine=migrated_engine, store=store))

    evaluation = EvaluationOptions(instances=1, templates=TEMPLATES, max_steps=2, max_new_tokens=16)
    first = asyncio.run(
        qc_gate(run="loop", trigger="inline", training_threshold=1.0, evaluation=evaluation)
    )
    assert first.triggered_training is True and first.batch_passed
    assert first.training is not None and first.training.result is not None
    training = first.training.result
    assert training.steps == 2 and training.checkpoint_id
    assert first.training.flow_run_id == training.flow_run_id is not None

    # The checkpoint's objects as a link artifact (Prefect stores it as a markdown link).
    from prefect.client.orchestration import get_client

    async def artifact_data(key: str) -> object:
        async with get_client() as client:
            found = await client.read_latest_artifacts()
            return next((a.data for a in found if a.key == key), None)

    link = str(asyncio.run(artifact_data(f"checkpoint-{training.checkpoint_id}")))
    assert link.startswith("[Checkpoint") and link.endswith(
        f"/checkpoints/{training.checkpoint_id}/model)"
    ), link

    again = asyncio.run(qc_gate(run="loop", trigger="inline", training_threshold=1.0))
    assert again.triggered_training is False  # re-running the gate does not train twice

    with migrated_engine.connect() as conn:
        lineage = conn.execute(
            text(
                "SELECT COUNT(DISTINCT episode_id) FROM training_lineage WHERE checkpoint_id = :c"
            ),
            {
                "c": training.checkpoint_id.hex
                if migrated_engine.dialect.name == "sqlite"
                else str(training.checkpoint_id)
            },
        ).scalar_one()
        runs = conn.execute(text("SELECT status, algo FROM training_run")).all()
    assert lineage == 4
    assert [tuple(r) for r in runs] == [("completed", "sft")]

    result = training.evaluation  # the triggered training was evaluated against its base
    assert result is not None and result.checkpoint_id == training.checkpoint_id
    assert set(result.model_dump()) >= {"completion_rate", "avg_steps", "tool_failure_rate"}
    assert 0.0 <= result.completion_rate <= 1.0 and result.avg_steps > 0
    assert result.previous_checkpoint_id == training.base_checkpoint_id
    assert result.previous is not None
    with migrated_engine.connect() as conn:
        evaluated = conn.execute(
            text(
                "SELECT COUNT(*) FROM episode e JOIN policy p ON p.id = e.policy_id WHERE p.checkpoint_id IS NOT NULL"
            )
        ).scalar_one()
    assert evaluated == 4  # 2 held-out tasks × (this checkpoint + the previous one)
    with migrated_engine.connect() as conn:
        running = conn.execute(
            text(
                "SELECT (SELECT COUNT(*) FROM collection_run WHERE status = 'running')"
                " + (SELECT COUNT(*) FROM training_run WHERE status = 'running')"
            )
        ).scalar_one()
        eval_runs = conn.execute(
            text("SELECT status FROM collection_run WHERE run_key LIKE 'eval-%'")
        ).all()
    assert running == 0
    assert [r[0] for r in eval_runs] == ["completed", "completed"]
