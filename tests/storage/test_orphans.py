"""`epiflow db orphans` against the loopback S3 server: every prefix epiflow writes
(`episodes/` with a Harbor CTRF report, `qc/` data docs under a run key with a slash,
`datasets/`, `checkpoints/`, `preflight/` probes), both directions (objects no row owns,
rows whose object is gone), keys outside epiflow's prefixes left alone; then the same
through the S3 fault proxy: transient faults are retried and the answer is the same, a
store whose answers never parse is one error line (after the retry policy's warnings),
exit 2."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from models import Artifact, Checkpoint, CollectionRun, Dataset, QcRun, run_id_for
from storage.objects import ObjectStore, make_object_store
from storage.orphans import delete_orphans, list_orphans
from storage.settings import ObjectStoreSettings
from tests.services.s3_fault_proxy import FAULTS, S3FaultProxy, always, every_nth

pytestmark = pytest.mark.s3

ROOT = Path(__file__).resolve().parents[2]
EPIFLOW = str(Path(sys.executable).parent / "epiflow")


def _ids() -> list[uuid.UUID]:
    return sorted(uuid.uuid4() for _ in range(3))


def _leftovers(engine: Engine, store: ObjectStore) -> tuple[set[str], set[tuple[str, str]]]:
    """Objects and rows of every kind, some whole, some without their row, some without
    their object; returns (the orphaned keys, the (table, key) of rows without objects)."""
    run_key = "nightly/2026-12-01"  # run keys may hold slashes
    run_id = run_id_for(run_key)
    e_ok, e_orphan, e_missing = _ids()
    q_ok, q_orphan, q_missing = _ids()
    d_ok, d_orphan, d_missing = _ids()
    c_ok, c_orphan, c_missing = _ids()
    owned = {
        f"episodes/{run_key}/{e_ok}/trajectory.json",
        f"episodes/{run_key}/{e_ok}/steps/0001.stdout",
        f"qc/{run_key}/{q_ok}/index.html",
        f"qc/{run_key}/{q_ok}/static/style.css",
        f"datasets/{d_ok}/sft.parquet",
        f"checkpoints/{c_ok}/model/config.json",
        f"checkpoints/{c_ok}/training_config.json",
    }
    orphans = {
        f"episodes/{run_key}/{e_orphan}/trajectory.json",
        f"episodes/{run_key}/{e_orphan}/verifier/ctrf.json",
        f"qc/{run_key}/{q_orphan}/index.html",
        f"datasets/{d_orphan}/sft.parquet",
        f"datasets/{d_ok}/dpo.parquet",
        f"checkpoints/{c_orphan}/model/config.json",
        f"preflight/probe-{uuid.uuid4().hex}",
    }
    for key in (*owned, *orphans, "notes/not-epiflows.txt"):
        store.put(key, b"x")
    with Session(engine) as session:
        session.add(CollectionRun(id=run_id, run_key=run_key, parameters={}, sandbox_spec={}))
        session.flush()
        for key in (
            f"episodes/{run_key}/{e_ok}/trajectory.json",
            f"episodes/{run_key}/{e_ok}/steps/0001.stdout",
            f"episodes/{run_key}/{e_missing}/trajectory.json",
        ):
            session.add(Artifact(key=key, kind="trajectory", run_id=run_id, size=1, sha256="0"))
        for qc_id in (q_ok, q_missing):
            session.add(
                QcRun(
                    id=qc_id,
                    run_id=run_id,
                    suite_versions={},
                    docs_key=f"qc/{run_key}/{qc_id}/index.html",
                )
            )
        for dataset_id in (d_ok, d_missing):
            session.add(
                Dataset(
                    id=dataset_id,
                    kind="sft",
                    filter={},
                    manifest={},
                    sha256="0",
                    object_key=f"datasets/{dataset_id}/sft.parquet",
                )
            )
        for checkpoint_id in (c_ok, c_missing):
            session.add(
                Checkpoint(
                    id=checkpoint_id,
                    object_prefix=f"checkpoints/{checkpoint_id}/model",
                    config_key=f"checkpoints/{checkpoint_id}/training_config.json",
                    metrics={},
                    evaluation={},
                )
            )
        session.commit()
    missing = {
        ("artifact", f"episodes/{run_key}/{e_missing}/trajectory.json"),
        ("qc_run", f"qc/{run_key}/{q_missing}/index.html"),
        ("dataset", f"datasets/{d_missing}/sft.parquet"),
        ("checkpoint", f"checkpoints/{c_missing}/model"),
        ("checkpoint", f"checkpoints/{c_missing}/training_config.json"),
    }
    return orphans, missing


def test_every_prefix_both_directions(
    migrated_engine: Engine, s3_settings: ObjectStoreSettings
) -> None:
    store = make_object_store(s3_settings)
    orphans, missing = _leftovers(migrated_engine, store)
    report = list_orphans(migrated_engine, store)
    assert set(report.keys) == orphans
    assert {(m.table, m.key) for m in report.missing} == missing

    assert set(delete_orphans(migrated_engine, store).keys) == orphans
    assert not any(store.exists(k) for k in orphans)
    assert store.exists("notes/not-epiflows.txt")  # not epiflow's: left alone
    after = list_orphans(migrated_engine, store)
    assert after.keys == [] and {(m.table, m.key) for m in after.missing} == missing


def _cli(engine: Engine, settings: ObjectStoreSettings, endpoint: str, home: Path, **extra: str):
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(
        PYTHONPATH=str(ROOT),
        EPIFLOW_HOME=str(home),
        EPIFLOW_DATABASE_URL=engine.url.render_as_string(hide_password=False),
        EPIFLOW_OBJECTS_URL=settings.url,
        EPIFLOW_OBJECTS_ENDPOINT=endpoint,
        EPIFLOW_OBJECTS_ACCESS_KEY=settings.access_key.get_secret_value()
        if settings.access_key
        else "",
        EPIFLOW_OBJECTS_SECRET_KEY=settings.secret_key.get_secret_value()
        if settings.secret_key
        else "",
        EPIFLOW_OBJECTS_SECURE="false",
        EPIFLOW_OBJECTS_BACKOFF_S="0.01",
        EPIFLOW_OBJECTS_BACKOFF_MAX_S="0.05",
        **extra,
    )
    return subprocess.run(
        [EPIFLOW, "db", "orphans"], env=env, capture_output=True, text=True, timeout=600
    )


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_through_a_flaky_store_it_answers_or_fails_in_one_line(
    migrated_engine: Engine,
    s3_settings: ObjectStoreSettings,
    s3_fault_proxy: S3FaultProxy,
    tmp_path: Path,
) -> None:
    orphans, missing = _leftovers(migrated_engine, make_object_store(s3_settings))
    expected = sorted(orphans) + sorted(f"missing: {t}" for t, _ in missing)

    # Every other request a transient fault (503 SlowDown, 500, HTML 502, dropped or
    # truncated answers): the bucket check and the listing are retried, the answer whole.
    s3_fault_proxy.schedule = every_nth(2, FAULTS)
    flaky = _cli(migrated_engine, s3_settings, s3_fault_proxy.endpoint, tmp_path / "a")
    assert flaky.returncode == 0, flaky.stderr
    assert s3_fault_proxy.counts["forwarded"] and sum(s3_fault_proxy.counts.values()) > 2
    lines = flaky.stdout.splitlines()
    assert sorted(ln for ln in lines if not ln.startswith("missing: ")) == sorted(orphans)
    assert sorted(ln.split(" ")[1] for ln in lines if ln.startswith("missing: ")) == sorted(
        t for t, _ in missing
    )
    assert len(lines) == len(expected)
    assert "Traceback" not in flaky.stderr

    # A listing that never parses: one line naming the store's setting, exit 2.
    s3_fault_proxy.schedule = always("garbled")
    broken = _cli(
        migrated_engine,
        s3_settings,
        s3_fault_proxy.endpoint,
        tmp_path / "b",
        EPIFLOW_OBJECTS_RETRIES="2",
    )
    assert broken.returncode == 2, broken.stderr
    lines = [ln for ln in broken.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in broken.stderr, broken.stderr
    assert "EPIFLOW_OBJECTS" in errors[0] and broken.stdout == ""
    # The other lines are the retry policy's, one per attempt it retried.
    assert all(" failed (" in ln and "retry" in ln for ln in lines if ln not in errors)
