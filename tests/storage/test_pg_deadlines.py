"""PostgreSQL calls have deadlines: the server cancels a statement past
`statement_timeout_s` and a lock wait past `lock_timeout_s`; a server that accepts
connections and never answers fails the connection check in one line after
`connect_timeout_s`. Real throwaway
PostgreSQL cluster; a bare listening socket that never answers."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from sqlalchemy import text
from sqlalchemy.exc import OperationalError

from storage.db import check_connection, make_engine
from storage.errors import DatabaseUnavailable
from storage.settings import DatabaseSettings

pytestmark = pytest.mark.postgres


def test_a_long_statement_is_cancelled_by_the_server(pg_url: str) -> None:
    engine = make_engine(DatabaseSettings(url=pg_url, statement_timeout_s=0.5))
    try:
        with engine.connect() as conn:
            with pytest.raises(OperationalError, match="statement timeout"):
                conn.execute(text("SELECT pg_sleep(120)"))
            conn.rollback()
            assert conn.execute(text("SHOW statement_timeout")).scalar_one() == "500ms"
    finally:
        engine.dispose()


def test_a_lock_wait_has_a_deadline(pg_url: str) -> None:
    holder = make_engine(DatabaseSettings(url=pg_url))
    waiter = make_engine(DatabaseSettings(url=pg_url, lock_timeout_s=0.5))
    try:
        with holder.connect() as a:
            a.execute(text("CREATE TABLE t (x int)"))
            a.commit()
            a.execute(text("LOCK TABLE t IN ACCESS EXCLUSIVE MODE"))
            with waiter.connect() as b, pytest.raises(OperationalError, match="lock timeout"):
                b.execute(text("SELECT * FROM t"))
            a.rollback()
    finally:
        holder.dispose()
        waiter.dispose()


@pytest.fixture
def silent_endpoint() -> Iterator[int]:
    """A socket that accepts connections (the kernel's backlog) and never answers."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    try:
        yield listener.getsockname()[1]
    finally:
        listener.close()


def test_a_server_that_never_answers_fails_the_check_in_one_line(silent_endpoint: int) -> None:
    url = f"postgresql+psycopg://epiflow:secret-pw@127.0.0.1:{silent_endpoint}/epiflow"
    engine = make_engine(DatabaseSettings(url=url, connect_timeout_s=2))
    try:
        with pytest.raises(DatabaseUnavailable, match="cannot connect") as e:
            check_connection(engine)
    finally:
        engine.dispose()
    message = e.value.user_message()
    assert "\n" not in message and "secret-pw" not in message
    assert "EPIFLOW_DATABASE_URL" in message
