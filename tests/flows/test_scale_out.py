"""Scale-out: a collection split into shard flow runs of the `collect-shard/shard`
deployment on a process work pool, two workers (one per "machine"), results landing in a
shared PostgreSQL and S3 server. Real Prefect server, real workers, real nsjail."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from storage import migrate
from storage.db import make_engine
from storage.objects import make_object_store
from storage.settings import DatabaseSettings, ObjectStoreSettings
from tests.services.prefect_server import BIN, PrefectServer

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def prefect_server() -> Iterator[PrefectServer]:
    server = PrefectServer()
    server.start()
    yield server
    server.stop()


@pytest.mark.slow
def test_two_workers_collect_shards_into_shared_stores(
    prefect_server: PrefectServer, pg_url: str, s3_settings: ObjectStoreSettings, tmp_path: Path
) -> None:
    engine = make_engine(DatabaseSettings(url=pg_url))
    migrate.upgrade(engine)
    assert s3_settings.access_key and s3_settings.secret_key
    shared = {
        "EPIFLOW_DATABASE_URL": pg_url,
        "EPIFLOW_OBJECTS_URL": s3_settings.url,
        "EPIFLOW_OBJECTS_ENDPOINT": str(s3_settings.endpoint),
        "EPIFLOW_OBJECTS_ACCESS_KEY": s3_settings.access_key.get_secret_value(),
        "EPIFLOW_OBJECTS_SECRET_KEY": s3_settings.secret_key.get_secret_value(),
        "EPIFLOW_OBJECTS_SECURE": "false",
        "EPIFLOW_REPO_DIR": str(REPO),
    }
    pool = "epiflow-scale-test"
    created = prefect_server.prefect("work-pool", "create", pool, "--type", "process", cwd=REPO)
    assert created.returncode == 0, created.stdout + created.stderr
    deployed = prefect_server.prefect(
        "--no-prompt",
        "deploy",
        "--prefect-file",
        "prefect.yaml",
        "--name",
        "shard",
        "--pool",
        pool,
        cwd=REPO,
        **shared,
    )
    assert deployed.returncode == 0, deployed.stdout + deployed.stderr

    workers = [
        subprocess.Popen(
            [
                str(BIN / "prefect"),
                "worker",
                "start",
                "--pool",
                pool,
                "--name",
                f"machine-{i}",
                "--limit",
                "1",
            ],
            env=prefect_server.env(**shared),
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        for i in range(2)
    ]
    try:
        env = prefect_server.env(**shared, EPIFLOW_PREFECT_API_URL=prefect_server.api_url)
        done = subprocess.run(
            [
                str(Path(sys.executable).parent / "epiflow"),
                "collect",
                "--tasks",
                "1",
                "--rollouts",
                "2",
                "--templates",
                "csv_to_json,dir_tree,log_errors,config_update",
                "--concurrency",
                "2",
                "--shards",
                "2",
                "--shard-deployment",
                "collect-shard/shard",
                "--run-key",
                "sharded",
                "--json",
            ],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=600,
        )
        assert done.returncode == 0, done.stderr[-3000:]
        result = json.loads(done.stdout)
        assert result["episodes"] == 8 and result["by_status"] == {"success": 8}
    finally:
        for w in workers:
            os.killpg(w.pid, signal.SIGTERM)
        for w in workers:
            try:
                w.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(w.pid, signal.SIGKILL)
                w.wait()

    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(DISTINCT id) FROM episode")).scalar_one() == 8
        keys = list(conn.execute(text("SELECT trajectory_key FROM episode")).scalars())
        status = conn.execute(
            text("SELECT status FROM collection_run WHERE run_key = 'sharded'")
        ).scalar_one()
    assert status == "completed"
    store = make_object_store(s3_settings)
    assert all(store.exists(k) for k in keys)

    runs = prefect_server.prefect(
        "flow-run",
        "ls",
        "--flow-name",
        "collect-shard",
        "--limit",
        "10",
        cwd=tmp_path,
        COLUMNS="300",
    )
    assert runs.stdout.count("COMPLETED") >= 2, runs.stdout
    engine.dispose()
