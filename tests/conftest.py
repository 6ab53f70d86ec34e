"""Project-wide fixtures: real PostgreSQL, a real S3 server, isolated settings.

PostgreSQL tests skip loudly when the binaries are missing, except under
EPIFLOW_REQUIRE_POSTGRES=1 (set by .ci/run), where they fail.
"""

from __future__ import annotations

import os
import tempfile

# Prefect reads its settings at import: give the whole test session a private home and
# no telemetry before anything imports it. A home this file made in a parent process (the
# pytest-xdist controller, whose environment the workers inherit) is replaced: each worker
# has its own, since a worker ending its session stops the shared local Prefect server of
# its home, which must not be one the other workers still use.
os.environ["PREFECT_HOME"] = (
    tempfile.mkdtemp(
        prefix=f"epiflow-prefect-home-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}-"
    )
    if os.environ.get("PREFECT_HOME") in (None, os.environ.get("_EPIFLOW_TESTS_PREFECT_HOME"))
    else os.environ["PREFECT_HOME"]
)
os.environ["_EPIFLOW_TESTS_PREFECT_HOME"] = os.environ["PREFECT_HOME"]
os.environ["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
os.environ.setdefault("PREFECT_LOGGING_LEVEL", "WARNING")
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine

from storage.settings import DatabaseSettings, ObjectStoreSettings
from tests.services.postgres import PostgresCluster, find_pg_bin, running_cluster
from tests.services.s3 import ACCESS_KEY, SECRET_KEY, S3Server

KEEP_ENV = ("EPIFLOW_REQUIRE_POSTGRES", "EPIFLOW_PG_BIN", "EPIFLOW_SCREENSHOT_DIR")
"""Variables about the test run itself, not settings of the code under test."""


@pytest.fixture(autouse=True)
def _isolated_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """No test reads the developer's EPIFLOW_* settings or writes into the checkout."""
    for name in list(os.environ):
        if name.startswith("EPIFLOW_") and name not in KEEP_ENV:
            monkeypatch.delenv(name)
    monkeypatch.setenv("EPIFLOW_HOME", str(tmp_path / "epiflow-home"))
    monkeypatch.setenv("EPIFLOW_DATABASE_URL", f"sqlite:///{tmp_path / 'epiflow.db'}")
    monkeypatch.setenv("EPIFLOW_OBJECTS_URL", str(tmp_path / "objects"))


@pytest.fixture(scope="session", autouse=True)
def _stop_local_prefect_server() -> Iterator[None]:
    """Commands run without EPIFLOW_PREFECT_API_URL (the demo) attach to the shared local
    Prefect server of the session's Prefect home; stop it when the session ends instead
    of leaving it for its idle period."""
    yield
    from config.prefect_server import server_dir, stop

    stop(server_dir(Path(os.environ["PREFECT_HOME"])))


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    bin_dir = find_pg_bin()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        reason = (
            "PostgreSQL binaries (initdb, pg_ctl) not found: install the `postgresql` package "
            "or set EPIFLOW_PG_BIN; PostgreSQL tests are NOT running"
        )
        if os.environ.get("EPIFLOW_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason + " (EPIFLOW_REQUIRE_POSTGRES=1)")
        pytest.skip(reason)
    with running_cluster(bin_dir) as cluster:
        yield cluster


@pytest.fixture
def pg_url(pg_cluster: PostgresCluster) -> str:
    """A fresh, empty database on the throwaway cluster."""
    return pg_cluster.url(pg_cluster.create_database())


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    return f"sqlite:///{tmp_path / 'test.db'}"


@pytest.fixture(params=["sqlite", "postgres"])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Each test using it runs on SQLite and on PostgreSQL."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'test.db'}"
    return str(request.getfixturevalue("pg_url"))


@pytest.fixture
def migrated_engine(db_url: str) -> Iterator[Engine]:
    """An engine on a freshly migrated database (SQLite and PostgreSQL)."""
    from storage import migrate
    from storage.db import make_engine

    engine = make_engine(DatabaseSettings(url=db_url))
    migrate.upgrade(engine)
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_settings(s3_server: S3Server) -> ObjectStoreSettings:
    """Settings for a fresh bucket on the loopback S3 server."""
    bucket = s3_server.create_bucket()
    return ObjectStoreSettings(
        url=f"s3://{bucket}/epiflow",
        endpoint=s3_server.endpoint,
        access_key=ACCESS_KEY,
        secret_key=SECRET_KEY,
        secure=False,
        retries=1,
        backoff_s=0.05,
    )


@pytest.fixture(scope="session")
def prefect_harness() -> Iterator[None]:
    """Prefect's real test harness: a temporary API server and database for the session."""
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=120):
        yield


@pytest.fixture(scope="session")
def prefect_api_url(prefect_harness: None) -> str:
    """The harness server's API URL, for subprocesses (CLI, workers) to share it."""
    from prefect.settings import PREFECT_API_URL

    url = PREFECT_API_URL.value()
    assert url, "the Prefect test harness did not set an API URL"
    return str(url)
