"""Alembic environment: the target is `SQLModel.metadata`; the URL comes from settings.

`storage.migrate` passes an open connection in `config.attributes["connection"]`; the
`alembic` CLI (developers) falls back to `DatabaseSettings()` built here, at its entry point.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection, create_engine, pool
from sqlmodel import SQLModel

import models  # noqa: F401  (registers every table on SQLModel.metadata)

config = context.config
target_metadata = SQLModel.metadata


def _run(connection: Connection) -> None:
    context.configure(
        connection=connection,
        target_metadata=target_metadata,
        compare_type=True,
        render_as_batch=connection.dialect.name == "sqlite",
    )
    with context.begin_transaction():
        context.run_migrations()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run(connection)
        return
    from storage.settings import DatabaseSettings

    engine = create_engine(DatabaseSettings().url.get_secret_value(), poolclass=pool.NullPool)
    with engine.connect() as conn:
        _run(conn)


if context.is_offline_mode():
    raise SystemExit("offline (--sql) migrations are not supported; run against a database")
run_migrations_online()
