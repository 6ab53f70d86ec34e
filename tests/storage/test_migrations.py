"""Alembic owns the schema: upgrade → downgrade → upgrade on SQLite and PostgreSQL,
autogenerate against the models finds nothing, and the analyst views exist."""

from __future__ import annotations

from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import inspect, text
from sqlmodel import SQLModel

import models  # noqa: F401
from storage import migrate
from storage.db import make_engine
from storage.settings import DatabaseSettings

VIEWS = {
    "episode_summary",
    "tool_failure_rates",
    "quality_by_suite",
    "quality_by_template",
    "training_lineage",
    "reproducibility_by_suite",
}
TABLES = {
    "task",
    "policy",
    "collection_run",
    "episode",
    "step",
    "artifact",
    "qc_run",
    "qc_result",
    "judgement",
    "dataset",
    "dataset_episode",
    "training_run",
    "checkpoint",
    "grpo_rollout",
}


def test_upgrade_downgrade_upgrade(db_url: str) -> None:
    engine = make_engine(DatabaseSettings(url=db_url))
    assert migrate.current_revision(engine) is None
    assert migrate.upgrade(engine) == migrate.head_revision()
    names = set(inspect(engine).get_table_names())
    assert names >= TABLES
    assert set(inspect(engine).get_view_names()) >= VIEWS

    assert migrate.downgrade(engine, "base") is None
    inspector = inspect(engine)
    assert not (TABLES & set(inspector.get_table_names()))
    assert not (VIEWS & set(inspector.get_view_names()))

    assert migrate.upgrade(engine) == migrate.head_revision()
    with engine.connect() as conn:
        for view in VIEWS:
            assert conn.execute(text(f"SELECT COUNT(*) FROM {view}")).scalar_one() == 0
    engine.dispose()


def test_autogenerate_finds_no_changes(migrated_engine) -> None:
    with migrated_engine.connect() as conn:
        context = MigrationContext.configure(conn, opts={"compare_type": True})
        diff = compare_metadata(context, SQLModel.metadata)
    assert diff == []


def test_json_columns_are_jsonb_on_postgres(pg_url: str) -> None:
    engine = make_engine(DatabaseSettings(url=pg_url))
    migrate.upgrade(engine)
    with engine.connect() as conn:
        kind = conn.execute(
            text(
                "SELECT data_type FROM information_schema.columns "
                "WHERE table_name = 'step' AND column_name = 'args'"
            )
        ).scalar_one()
        comment = conn.execute(text("SELECT col_description('episode'::regclass, 1)")).scalar_one()
    assert kind == "jsonb"
    assert comment  # every column carries its docstring as a SQL comment
    engine.dispose()


def test_ensure_current_names_the_fix(sqlite_url: str) -> None:
    import pytest

    from storage.errors import SchemaOutdated

    engine = make_engine(DatabaseSettings(url=sqlite_url))
    with pytest.raises(SchemaOutdated, match="epiflow db upgrade"):
        migrate.ensure_current(engine)
    migrate.upgrade(engine)
    migrate.ensure_current(engine)


def test_0003_keeps_every_row_and_unreported_tokens_become_null(db_url: str) -> None:
    """SQLite rebuilds `episode` in 0003: its steps must survive (no cascade), in both
    directions; a 0 total that no step reported becomes NULL, a reported one stays."""
    from sqlalchemy import func, select
    from sqlmodel import col

    from models import Episode, Step
    from storage.ingest import EpisodeBundle, ingest_episodes
    from tests.storage.builders import make_trajectory

    engine = make_engine(DatabaseSettings(url=db_url))
    migrate.upgrade(engine)
    silent = make_trajectory("tokens", "builtin/t@1#0", 0, n_steps=3)
    for step in silent.steps:
        step.prompt_tokens = step.completion_tokens = None
    reported = make_trajectory("tokens", "builtin/t@1#1", 0, n_steps=3)
    ingest_episodes(engine, [EpisodeBundle(trajectory=silent), EpisodeBundle(trajectory=reported)])
    expected = reported.prompt_tokens

    def state() -> tuple[int, dict[str, int | None]]:
        with engine.connect() as conn:
            steps = conn.execute(select(func.count()).select_from(Step)).scalar_one()
            tokens: dict[str, int | None] = dict(
                conn.execute(
                    text("SELECT task_id, prompt_tokens FROM episode ORDER BY task_id")
                ).all()
            )
        return int(steps), tokens

    assert state() == (6, {"builtin/t@1#0": None, "builtin/t@1#1": expected})
    assert migrate.downgrade(engine, "0002") == "0002"
    assert state() == (6, {"builtin/t@1#0": 0, "builtin/t@1#1": expected})
    assert migrate.upgrade(engine) == migrate.head_revision()
    assert state() == (6, {"builtin/t@1#0": None, "builtin/t@1#1": expected})
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Episode)).scalar_one() == 2
        assert conn.execute(select(col(Episode.agent_name)).distinct()).scalars().all() == [
            "epiflow"
        ]
        for view in VIEWS:
            conn.execute(text(f"SELECT COUNT(*) FROM {view}")).scalar_one()
    engine.dispose()
