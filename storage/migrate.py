"""Schema migrations through Alembic: upgrade, downgrade, current, and the "is it current?" check.

Alembic owns the schema; nothing in a production path calls `create_all`.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError, OperationalError

from storage.db import SETTING, check_connection
from storage.errors import DatabaseUnavailable, SchemaOutdated

MIGRATIONS_DIR = Path(__file__).resolve().parent.parent / "migrations"


def alembic_config() -> Config:
    """An Alembic config pointing at `migrations/`; the connection is passed per call."""
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


def head_revision() -> str:
    """The newest revision the code knows."""
    head = ScriptDirectory.from_config(alembic_config()).get_current_head()
    if head is None:  # pragma: no cover - the repository always ships revisions
        raise SchemaOutdated("no migrations found in migrations/versions")
    return head


def current_revision(engine: Engine) -> str | None:
    """The revision the database is at; None for an empty database."""
    check_connection(engine)
    with engine.connect() as conn:
        return MigrationContext.configure(conn).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> str | None:
    """Upgrade the database to `revision`; returns the revision it is at afterwards."""
    _run(engine, "upgrade", revision)
    return current_revision(engine)


def downgrade(engine: Engine, revision: str = "-1") -> str | None:
    """Downgrade the database to `revision` (`base` empties it)."""
    _run(engine, "downgrade", revision)
    return current_revision(engine)


def _run(engine: Engine, verb: str, revision: str) -> None:
    check_connection(engine)
    config = alembic_config()
    try:
        with engine.connect() as conn:
            sqlite = conn.dialect.name == "sqlite"
            if sqlite:
                # SQLite rebuilds a table to change a column (batch mode): with foreign keys
                # on, dropping the old `episode` would cascade-delete its steps. The pragma
                # only takes effect outside a transaction, so before anything runs.
                conn.exec_driver_sql("PRAGMA foreign_keys=OFF")
                conn.commit()
            try:
                with conn.begin():
                    if not sqlite:
                        # A migration may rewrite a large table: no statement deadline.
                        conn.exec_driver_sql("SET LOCAL statement_timeout = 0")
                    config.attributes["connection"] = conn
                    getattr(command, verb)(config, revision)
                    if sqlite:
                        broken = conn.exec_driver_sql("PRAGMA foreign_key_check").fetchall()
                        if broken:
                            raise DatabaseUnavailable(
                                f"migration {verb} to {revision} left {len(broken)} row(s) "
                                f"with dangling foreign keys (first: {tuple(broken[0])}); "
                                "nothing was committed",
                                setting=SETTING,
                            )
            finally:
                if sqlite:
                    conn.exec_driver_sql("PRAGMA foreign_keys=ON")
                    conn.commit()
    except (OperationalError, DBAPIError) as e:
        raise DatabaseUnavailable(
            f"migration {verb} to {revision} failed: {str(e.orig or e).strip().splitlines()[0]}",
            setting=SETTING,
        ) from e


def ensure_current(engine: Engine) -> None:
    """Raise `SchemaOutdated` unless the database is at the code's head revision."""
    current = current_revision(engine)
    head = head_revision()
    if current != head:
        where = "empty" if current is None else f"at revision {current}"
        raise SchemaOutdated(
            f"the database is {where} but this code needs revision {head}: run `epiflow db upgrade`",
            setting=SETTING,
        )
