"""Project-wide fixtures: real PostgreSQL, a real S3 server, isolated settings.

PostgreSQL tests skip loudly when the binaries are missing, except under
EPIFLOW_REQUIRE_POSTGRES=1 (set by .ci/run), where they fail.
"""

from __future__ import annotations

import os
import shutil
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
from tests import durations, lanes
from tests.services.postgres import PostgresCluster, pg_bin_or_skip, running_cluster
from tests.services.s3 import ACCESS_KEY, SECRET_KEY, S3Server
from tests.services.s3_fault_proxy import S3FaultProxy

KEEP_ENV = ("EPIFLOW_REQUIRE_POSTGRES", "EPIFLOW_PG_BIN", "EPIFLOW_SCREENSHOT_DIR")
"""Variables about the test run itself, not settings of the code under test."""


@pytest.hookimpl(wrapper=True)
def pytest_collection_modifyitems(
    config: pytest.Config, items: list[pytest.Item]
) -> Iterator[None]:
    lanes.mark_out_of_lane(items)  # before `-m` deselects by these marks
    yield
    if os.environ.get("PYTEST_XDIST_WORKER"):  # a serial run keeps pytest's order
        items[:] = durations.slowest_first(items, durations.load())  # what `-m` selected


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
    from orchestration.prefect_server import server_dir, stop

    stop(server_dir(Path(os.environ["PREFECT_HOME"])))


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    with running_cluster(pg_bin_or_skip()) as cluster:
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


@pytest.fixture(scope="session")
def _migrated_sqlite_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A SQLite file migrated to head once per session (per xdist worker)."""
    from storage import migrate
    from storage.db import make_engine

    path = tmp_path_factory.mktemp("migrated-template") / "head.db"
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{path}"))
    migrate.upgrade(engine)
    engine.dispose()
    return path


@pytest.fixture(scope="session")
def _migrated_pg_template(pg_cluster: PostgresCluster) -> str:
    """A PostgreSQL database migrated to head once per session, that tests clone (no
    connection to it stays open: CREATE DATABASE … TEMPLATE needs it idle)."""
    from storage import migrate
    from storage.db import make_engine

    name = pg_cluster.create_database()
    engine = make_engine(DatabaseSettings(url=pg_cluster.url(name)))
    migrate.upgrade(engine)
    engine.dispose()
    return name


@pytest.fixture
def migrated_engine(request: pytest.FixtureRequest, db_url: str) -> Iterator[Engine]:
    """An engine on a fresh database at the head revision (SQLite and PostgreSQL): a copy
    of the session's migrated template, the same schema `migrate.upgrade` writes (the
    migrations themselves are tested on empty databases in tests/storage/test_migrations.py)."""
    from sqlalchemy.engine import make_url

    from storage import migrate
    from storage.db import make_engine

    url = make_url(db_url)
    if url.get_backend_name() == "sqlite":
        assert url.database and not Path(url.database).exists()
        template: Path = request.getfixturevalue("_migrated_sqlite_template")
        for suffix in ("", "-wal"):  # a WAL left unmerged is part of the database
            if template.with_name(template.name + suffix).exists():
                shutil.copyfile(template.with_name(template.name + suffix), url.database + suffix)
    else:
        cluster: PostgresCluster = request.getfixturevalue("pg_cluster")
        assert url.database
        cluster.replace_database(url.database, request.getfixturevalue("_migrated_pg_template"))
    engine = make_engine(DatabaseSettings(url=db_url))
    assert migrate.current_revision(engine) == migrate.head_revision()
    yield engine
    engine.dispose()


@pytest.fixture(scope="session")
def s3_server() -> Iterator[S3Server]:
    server = S3Server()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def s3_fault_proxy(s3_server: S3Server) -> Iterator[S3FaultProxy]:
    """A fault proxy in front of the session's S3 server, passing everything until a test
    sets its schedule or fault."""
    proxy = S3FaultProxy(s3_server.port)
    proxy.start()
    yield proxy
    proxy.stop()


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
