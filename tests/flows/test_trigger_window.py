"""The volume trigger counts and trains on the same thing: every gate run since the last
triggered training (`--trigger none` ones included), each episode once with its latest
verdict, up to the gate that fired — real collections in nsjail, real `qc-gate` flows, on
SQLite and PostgreSQL."""

from __future__ import annotations

import asyncio
import json
import uuid

import pytest
from sqlalchemy import Engine, text

from collection.request import CollectRequest
from collection.runner import collect_in_process
from storage.objects import LocalObjectStore

TEMPLATES = ["csv_to_json", "dir_tree"]
NEVER = 1e9
"""A threshold no test volume reaches."""


def collect(engine: Engine, store: LocalObjectStore, run_key: str) -> None:
    request = CollectRequest(run_key=run_key, tasks=1, concurrency=2, templates=TEMPLATES)
    asyncio.run(collect_in_process(request, engine=engine, store=store))


def gate(run_key: str) -> uuid.UUID:
    from flows.qc import qc_gate

    result = asyncio.run(qc_gate(run=run_key, trigger="none", training_threshold=NEVER))
    assert result.triggered_training is False and result.training_qc_runs == []
    return result.qc_run_id


def scores(engine: Engine, *qc_runs: uuid.UUID) -> dict[str, float]:
    """Episode → quality score of these gate runs' results, read back from SQL."""
    out: dict[str, float] = {}
    with engine.connect() as conn:
        for q in qc_runs:
            rows = conn.execute(
                text("SELECT episode_id, quality_score FROM qc_result WHERE qc_run_id = :q"),
                {"q": q.hex if engine.dialect.name == "sqlite" else str(q)},
            ).all()
            out.update({str(e): float(s or 0.0) for e, s in rows})
    return out


def test_the_window_is_what_the_snapshot_trains_on(prefect_harness: None, gated_env) -> None:
    from storage.qc import mark_triggered, trigger_window
    from training.snapshots import build_snapshot

    engine, store = gated_env
    collect(engine, store, "night-a")
    collect(engine, store, "night-b")
    first_a = gate("night-a")
    gate_b = gate("night-b")
    again_a = gate("night-a")  # a re-gate: A's episodes now carry this gate's verdicts

    window = trigger_window(engine, until=again_a)
    latest = scores(engine, gate_b, again_a)
    assert len(latest) == 4  # 2 episodes of A, 2 of B, each once
    assert window.episodes == 4
    assert window.volume == pytest.approx(sum(latest.values()))
    # A's first gate holds no latest verdict: only the later gates feed the training
    assert window.qc_run_ids == (gate_b, again_a)

    # the snapshot of every gate counted holds each episode once, even when the older
    # gate of A is passed too (its verdicts are superseded by the re-gate)
    with engine.connect() as conn:
        run_ids = [
            uuid.UUID(str(r))
            for (r,) in conn.execute(text("SELECT id FROM collection_run ORDER BY run_key"))
        ]
    info = build_snapshot(
        engine, store, kind="sft", run_ids=run_ids, qc_run_id=[first_a, *window.qc_run_ids]
    )
    with engine.connect() as conn:
        lineage = conn.execute(
            text("SELECT episode_id FROM dataset_episode WHERE dataset_id = :d"),
            {"d": info.id.hex if engine.dialect.name == "sqlite" else str(info.id)},
        ).all()
    assert len(lineage) == len({str(e) for (e,) in lineage}) == info.n_episodes
    assert 0 < info.n_episodes <= 4
    assert info.filter["qc_run_ids"] == sorted(str(q) for q in (first_a, gate_b, again_a))

    # once the last gate triggered, the next window starts after it and stops at its bound
    mark_triggered(engine, again_a)
    collect(engine, store, "night-c")
    gate_c = gate("night-c")
    later = gate("night-b")  # ends after gate C: left for the window after C's
    at_c = trigger_window(engine, until=gate_c)
    assert at_c.qc_run_ids == (gate_c,) and at_c.episodes == 2
    assert at_c.volume == pytest.approx(sum(scores(engine, gate_c).values()))
    everything = trigger_window(engine)
    assert everything.qc_run_ids == (gate_c, later) and everything.episodes == 4


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
def test_the_triggered_training_trains_on_every_gate_counted(
    prefect_harness: None, gated_env, monkeypatch: pytest.MonkeyPatch
) -> None:
    from flows.evaluate import EvaluationOptions
    from flows.qc import qc_gate

    engine, store = gated_env
    monkeypatch.setenv("EPIFLOW_TRAINING_MAX_STEPS", "1")
    collect(engine, store, "night-a")
    collect(engine, store, "night-b")
    gate_a = gate("night-a")  # `--trigger none`: counted, not trained on yet
    fired = asyncio.run(
        qc_gate(
            run="night-b",
            trigger="inline",
            training_threshold=0.1,
            evaluation=EvaluationOptions(instances=0),
        )
    )
    assert fired.triggered_training is True
    assert fired.training_qc_runs == [gate_a, fired.qc_run_id]
    assert fired.training is not None and fired.training.result is not None
    dataset_id = fired.training.result.dataset_id
    key = dataset_id.hex if engine.dialect.name == "sqlite" else str(dataset_id)
    with engine.connect() as conn:
        raw_filter, n_episodes = conn.execute(
            text("SELECT filter, n_episodes FROM dataset WHERE id = :d"), {"d": key}
        ).one()
        fed_runs = conn.execute(
            text(
                "SELECT DISTINCT r.run_key FROM dataset_episode d"
                " JOIN episode e ON e.id = d.episode_id"
                " JOIN collection_run r ON r.id = e.run_id WHERE d.dataset_id = :d"
            ),
            {"d": key},
        ).all()
    data_filter = raw_filter if isinstance(raw_filter, dict) else json.loads(raw_filter)
    assert data_filter["qc_run_ids"] == sorted(str(q) for q in (gate_a, fired.qc_run_id))
    assert {r for (r,) in fed_runs} == {"night-a", "night-b"}  # both nights, not the last
    assert n_episodes <= 4
