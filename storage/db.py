"""Engine and session factory for the metadata database (SQLite or PostgreSQL).

Connection failures become `DatabaseUnavailable` naming EPIFLOW_DATABASE_URL, with the
URL redacted: the password never reaches a message.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Engine, event, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError, OperationalError
from sqlmodel import Session, create_engine

from storage.errors import DatabaseUnavailable
from storage.settings import DatabaseSettings

SETTING = "EPIFLOW_DATABASE_URL"


def make_engine(settings: DatabaseSettings) -> Engine:
    """Build an engine; creates the SQLite file's directory. Does not connect yet."""
    url = make_url(settings.url.get_secret_value())
    connect_args: dict[str, Any] = {}
    kwargs: dict[str, Any] = {"echo": settings.echo, "pool_pre_ping": True}
    if url.get_backend_name() == "sqlite":
        if url.database and url.database != ":memory:":
            try:
                Path(url.database).parent.mkdir(parents=True, exist_ok=True)
            except OSError as e:
                raise DatabaseUnavailable(
                    f"cannot create the directory of the SQLite database {url.database}: {e.strerror}",
                    setting=SETTING,
                ) from e
        connect_args["timeout"] = 30
    elif url.get_backend_name() == "postgresql":
        connect_args["connect_timeout"] = settings.connect_timeout_s
        # Sessions in UTC, so text casts and date buckets of timestamptz do not depend on
        # the server's or the role's time zone; statements and lock waits have deadlines.
        connect_args["options"] = (
            f"-c timezone=UTC -c statement_timeout={_ms(settings.statement_timeout_s)} "
            f"-c lock_timeout={_ms(settings.lock_timeout_s)}"
        )
        connect_args.update(
            keepalives=1,
            keepalives_idle=settings.keepalive_idle_s,
            keepalives_interval=10,
            keepalives_count=3,
        )
        kwargs["pool_size"] = 10
        kwargs["max_overflow"] = 10
    try:
        engine = create_engine(url, connect_args=connect_args, **kwargs)
    except ImportError as e:  # a driver SQLAlchemy knows whose package is not installed
        raise DatabaseUnavailable(
            f"the database driver {url.get_driver_name()!r} is not installed "
            f"({e.name or e}); use postgresql+psycopg://… or sqlite:///…",
            setting=SETTING,
        ) from e
    if url.get_backend_name() == "sqlite":
        event.listen(engine, "connect", _sqlite_pragmas)
    return engine


def _ms(seconds: float) -> int:
    return round(seconds * 1000)


def _sqlite_pragmas(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def check_connection(engine: Engine) -> None:
    """Connect once; raise `DatabaseUnavailable` with a redacted one-line reason."""
    try:
        with engine.connect() as conn:
            conn.execute(text("SELECT 1"))
    except (OperationalError, DBAPIError) as e:
        reason = _first_line(str(e.orig) if getattr(e, "orig", None) else str(e))
        raise DatabaseUnavailable(
            f"cannot connect to the database {engine.url.render_as_string(hide_password=True)}: {reason}",
            setting=SETTING,
        ) from e


def _first_line(message: str) -> str:
    line = message.strip().splitlines()[0] if message.strip() else "unknown error"
    return line[:300]


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session committed on success and rolled back on any error."""
    with Session(engine, expire_on_commit=False) as session:
        try:
            yield session
            session.commit()
        except BaseException:
            session.rollback()
            raise
