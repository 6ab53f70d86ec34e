"""infra/sql/analyst_role.sql, run with psql by a database owner who is not a superuser:
it stops at the first missing privilege (non-zero exit, one line naming it, nothing
changed), and once it ran the analyst can read everything and write nothing, tried with
a list of write attempts."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest

from storage import migrate
from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.services.postgres import PostgresCluster, find_pg_bin

INFRA = Path(__file__).resolve().parents[2] / "infra" / "sql"
SCRIPT = INFRA / "analyst_role.sql"
LARGE_OBJECTS = INFRA / "analyst_large_objects.sql"
VIEWS = (
    "episode_summary",
    "tool_failure_rates",
    "quality_by_suite",
    "quality_by_template",
    "training_lineage",
    "reproducibility_by_suite",
)
PASSWORD = "role-pw"

WRITE_ATTEMPTS = [
    "CREATE TEMP TABLE t (x int)",
    "CREATE TEMPORARY VIEW v AS SELECT 1 AS x",
    "SELECT 1 AS x INTO TEMP t2",
    "CREATE TEMP SEQUENCE s",
    "CREATE FUNCTION pg_temp.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "DO $$ BEGIN CREATE TEMP TABLE t3 (x int); END $$",
    "CREATE TABLE sneaky (x int)",
    "CREATE TABLE public.sneaky (x int)",
    "CREATE VIEW public.v AS SELECT 1 AS x",
    "CREATE SEQUENCE public.s",
    "CREATE TYPE public.pair AS (a int, b int)",
    "CREATE FUNCTION public.f() RETURNS int LANGUAGE sql AS 'SELECT 1'",
    "CREATE SCHEMA sneaky",
    "CREATE ROLE sneaky",
    "CREATE DATABASE sneaky",
    "SELECT lo_create(0)",
    "SELECT lo_creat(-1)",
    "SELECT lo_from_bytea(0, 'x')",
    "SELECT lo_import('/etc/hostname')",
    "SELECT lo_put({owned_lo}, 0, 'x')",
    "SELECT lo_unlink({owned_lo})",
    "INSERT INTO policy (id, kind, config, created_at) VALUES ('x', 'x', '{{}}', now())",
    "UPDATE episode SET status = 'x'",
    "DELETE FROM episode",
    "TRUNCATE step",
    "ALTER TABLE episode ADD COLUMN sneaky int",
    "CREATE INDEX sneaky ON episode (status)",
    "COMMENT ON TABLE episode IS 'sneaky'",
    "DROP VIEW episode_summary",
    "SET ROLE {owner}",
]
"""Each must fail with SQLSTATE 42501 (insufficient privilege)."""


@dataclass
class Database:
    cluster: PostgresCluster
    name: str
    owner: str

    def url(self, user: str, *, database: str | None = None) -> str:
        password = self.cluster.password if user == "postgres" else PASSWORD
        return (
            f"postgresql://{user}:{password}@{self.cluster.host}:{self.cluster.port}/"
            f"{database or self.name}"
        )

    def psql(self, user: str, script: Path, *variables: str) -> subprocess.CompletedProcess[str]:
        args = [psql_binary(), "-X", self.url(user), "-f", str(script)]
        for v in variables:
            args += ["-v", v]
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        return subprocess.run(args, capture_output=True, text=True, timeout=120, env=env)


def psql_binary() -> str:
    """psql beside the server binaries the cluster runs (symlinks followed), else on PATH."""
    bin_dir = find_pg_bin()
    candidates = (
        []
        if bin_dir is None
        else [bin_dir / "psql", (bin_dir / "initdb").resolve().parent / "psql"]
    )
    for candidate in candidates:
        if candidate.exists():
            return str(candidate)
    found = shutil.which("psql")
    assert found, "psql not found beside the PostgreSQL binaries or on PATH"
    return found


def superuser(cluster: PostgresCluster, database: str = "postgres") -> psycopg.Connection:
    return psycopg.connect(
        host=cluster.host,
        port=cluster.port,
        user="postgres",
        password=cluster.password,
        dbname=database,
        autocommit=True,
    )


@pytest.fixture
def owned_database(pg_cluster: PostgresCluster) -> Iterator[Database]:
    """A database owned by a login role that is not a superuser, migrated by that role."""
    suffix = uuid.uuid4().hex[:8]
    owner, name = f"owner_{suffix}", f"owned_{suffix}"
    with superuser(pg_cluster) as conn:
        conn.execute(f"CREATE ROLE {owner} LOGIN PASSWORD '{PASSWORD}'")
        conn.execute(f"CREATE DATABASE {name} OWNER {owner}")
    db = Database(pg_cluster, name, owner)
    engine = make_engine(
        DatabaseSettings(url=db.url(owner).replace("postgresql", "postgresql+psycopg", 1))
    )
    migrate.upgrade(engine)
    engine.dispose()
    yield db


def public_can_temp(db: Database) -> bool:
    with superuser(db.cluster, db.name) as conn:
        row = conn.execute(
            "SELECT has_database_privilege('public', current_database(), 'TEMPORARY')"
        ).fetchone()
    assert row is not None
    return bool(row[0])


def role_exists(db: Database, role: str) -> bool:
    with superuser(db.cluster) as conn:
        return (
            conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (role,)).fetchone()
            is not None
        )


def one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, done.stderr
    return lines[0]


def test_stops_at_the_first_missing_privilege_and_changes_nothing(
    owned_database: Database,
) -> None:
    db = owned_database
    analyst = f"analyst_{uuid.uuid4().hex[:8]}"
    done = db.psql(db.owner, SCRIPT, f"analyst_role={analyst}")
    assert done.returncode != 0
    assert "CREATEROLE" in one_error_line(done) and analyst in done.stderr
    assert not role_exists(db, analyst) and public_can_temp(db)

    with superuser(db.cluster) as conn:
        conn.execute(f"ALTER ROLE {db.owner} CREATEROLE")
    done = db.psql(db.owner, SCRIPT, f"analyst_role={analyst}")
    assert done.returncode != 0
    line = one_error_line(done)
    assert "large objects" in line and "superuser" in line and "analyst_large_objects.sql" in line
    assert not role_exists(db, analyst) and public_can_temp(db)

    done = db.psql(db.owner, LARGE_OBJECTS)  # the superuser's part is refused to the owner
    assert done.returncode != 0 and "needs a superuser" in one_error_line(done)


def test_analyst_reads_everything_and_writes_nothing(owned_database: Database) -> None:
    db = owned_database
    analyst, login = f"analyst_{uuid.uuid4().hex[:8]}", f"alice_{uuid.uuid4().hex[:8]}"
    with superuser(db.cluster) as conn:
        conn.execute(f"ALTER ROLE {db.owner} CREATEROLE")
    done = db.psql("postgres", LARGE_OBJECTS)
    assert done.returncode == 0, done.stderr
    for _ in range(2):  # idempotent
        done = db.psql(db.owner, SCRIPT, f"analyst_role={analyst}")
        assert done.returncode == 0, done.stderr
        assert f"analyst role {analyst} can read database {db.name}" in done.stdout
    assert not public_can_temp(db)

    owner_url = db.url(db.owner)
    with psycopg.connect(owner_url, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {login} LOGIN PASSWORD '{PASSWORD}' IN ROLE {analyst}")
        conn.execute("CREATE TEMP TABLE still_mine (x int)")  # the owner keeps its rights
        row = conn.execute("SELECT lo_from_bytea(0, 'owned by the owner')").fetchone()
        assert row is not None
        owned_lo = row[0]
        # A later migration's view: covered by the default privileges.
        conn.execute("CREATE VIEW later_view AS SELECT 1 AS x")

    with psycopg.connect(db.url(login), autocommit=True) as conn:
        for view in (*VIEWS, "later_view"):
            assert conn.execute(f"SELECT COUNT(*) FROM {view}").fetchone() is not None
        assert conn.execute("SELECT COUNT(*) FROM step").fetchone() == (0,)
        refused = []
        for attempt in WRITE_ATTEMPTS:
            sql = attempt.format(owned_lo=owned_lo, owner=db.owner)
            try:
                conn.execute(sql)
            except psycopg.errors.InsufficientPrivilege:
                refused.append(sql)
            except psycopg.Error as e:
                pytest.fail(f"{sql!r} failed for another reason: {e.sqlstate} {e}")
            else:
                pytest.fail(f"the analyst could run {sql!r}")
        assert len(refused) == len(WRITE_ATTEMPTS)

    with superuser(db.cluster, db.name) as conn:
        mine = conn.execute(
            "SELECT COUNT(*) FROM pg_largeobject_metadata m JOIN pg_roles r "
            "ON r.oid = m.lomowner WHERE r.rolname IN (%s, %s)",
            (analyst, login),
        ).fetchone()
        assert mine == (0,)
        conn.execute(f"DROP OWNED BY {login}")
        conn.execute(f"DROP ROLE {login}")
