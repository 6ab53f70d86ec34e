"""The analyst role in infra/ can read the views and tables and cannot write."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest
from sqlalchemy.engine import make_url

from storage import migrate
from storage.db import make_engine
from storage.settings import DatabaseSettings

SCRIPT = Path(__file__).resolve().parents[2] / "infra" / "sql" / "analyst_role.sql"


def test_analyst_reads_views_and_cannot_write(pg_url: str, pg_cluster) -> None:
    engine = make_engine(DatabaseSettings(url=pg_url))
    migrate.upgrade(engine)
    engine.dispose()
    url = make_url(pg_url)
    owner = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(owner, autocommit=True) as conn:
        conn.execute(SCRIPT.read_text())
        conn.execute(SCRIPT.read_text())  # idempotent
        conn.execute("DROP ROLE IF EXISTS analyst_test")
        conn.execute("CREATE ROLE analyst_test LOGIN PASSWORD 'analyst-pw' IN ROLE epiflow_analyst")
    analyst = (
        url.set(drivername="postgresql", username="analyst_test", password="analyst-pw")
    ).render_as_string(hide_password=False)
    with psycopg.connect(analyst, autocommit=True) as conn:
        for view in (
            "episode_summary",
            "tool_failure_rates",
            "quality_by_suite",
            "training_lineage",
        ):
            assert conn.execute(f"SELECT COUNT(*) FROM {view}").fetchone() == (0,)
        assert conn.execute("SELECT COUNT(*) FROM step").fetchone() == (0,)
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute(
                "INSERT INTO policy (id, kind, config, created_at) VALUES ('x', 'x', '{}', now())"
            )
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("DELETE FROM episode")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE sneaky (x int)")
