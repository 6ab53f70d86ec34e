"""One run key, one collection at a time.

Two processes collecting the same run key at once would both find the same episodes
missing and run each of them twice. So the process that collects a key holds the key's
lock for as long as it runs, and a second one fails at once with `RunKeyBusy` (one line
naming the holder and `--run-key`). The lock lives where the run lives, in the database:

- PostgreSQL: a session-level advisory lock (`pg_try_advisory_lock`) on a connection of
  its own, named in `pg_stat_activity.application_name` so a refused process can say who
  holds it. The server drops the lock when that connection ends: a process killed with
  SIGKILL closes its socket at once, and a machine that vanishes is noticed by the TCP
  keepalives set on the session (`tcp_keepalives_*`: about 90 s).
- SQLite: an exclusive `flock` on a file beside the database (`<db>.locks/<hash>.lock`,
  which also records the holder). The kernel drops it when the process ends, however it
  ends; SQLite serves one machine, so a file lock covers every process that can open it.
  An in-memory database locks within the process.

Either way nothing expires and nothing needs cleaning: a crashed holder never blocks the
retry that resumes its run.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import socket
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy import Connection, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from core.errors import reason_line
from storage.db import SETTING as DATABASE_SETTING
from storage.db import make_engine
from storage.errors import DatabaseUnavailable, RunKeyBusy
from storage.settings import DatabaseSettings

APPLICATION_PREFIX = "epiflow run-key "
"""`application_name` prefix of the PostgreSQL connections that hold run-key locks."""

_KEEPALIVES = (
    # A holder whose machine vanished (no FIN) is dropped after ~30 + 3 x 20 s.
    "SET tcp_keepalives_idle = 30",
    "SET tcp_keepalives_interval = 20",
    "SET tcp_keepalives_count = 3",
)

_memory_locks: set[str] = set()
_memory_guard = threading.Lock()


def shard_lock_name(run_key: str, index: int, count: int) -> str:
    """The lock of one shard of a sharded run (its parent holds the run key's own)."""
    return f"{run_key}#shard-{index + 1}-of-{count}"


def lock_id(name: str) -> int:
    """The signed 64-bit advisory lock id of `name`."""
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:8], "big", signed=True)


def _holder() -> str:
    return f"pid {os.getpid()} on {socket.gethostname()} since {datetime.now(UTC):%Y-%m-%d %H:%M:%S} UTC"


def _busy(name: str, holder: str | None) -> RunKeyBusy:
    by = f" by {holder}" if holder else ""
    return RunKeyBusy(
        f"run key {name!r} is being collected right now{by}; collecting it twice at once "
        "would run its episodes twice. Wait for that run to end (re-running the key then "
        "completes whatever is missing) or choose another --run-key",
        setting="--run-key",
    )


class RunKeyLock:
    """A held run-key lock; `release` (or the holder's death) frees it."""

    def __init__(self, name: str, stack: contextlib.ExitStack) -> None:
        self.name = name
        """The run key (or shard lock name) held."""
        self._stack = stack

    def release(self) -> None:
        """Free the lock (idempotent)."""
        self._stack.close()


def acquire_run_key(settings: DatabaseSettings, name: str) -> RunKeyLock:
    """Take the lock of run key (or shard lock name) `name`, without waiting.

    Raises:
        RunKeyBusy: another live process holds it (the message names the holder).
        DatabaseUnavailable: the database cannot be reached to take it.
    """
    url = make_url(settings.url.get_secret_value())
    stack = contextlib.ExitStack()
    try:
        if url.get_backend_name() == "postgresql":
            _acquire_postgres(settings, name, stack)
        elif url.database and url.database != ":memory:":
            _acquire_file(Path(url.database), name, stack)
        else:
            _acquire_memory(name, stack)
    except BaseException:
        stack.close()
        raise
    return RunKeyLock(name, stack)


@contextlib.contextmanager
def run_key_lock(settings: DatabaseSettings, name: str) -> Iterator[RunKeyLock]:
    """Hold the lock of `name` for the block (see `acquire_run_key`)."""
    lock = acquire_run_key(settings, name)
    try:
        yield lock
    finally:
        lock.release()


def _acquire_postgres(settings: DatabaseSettings, name: str, stack: contextlib.ExitStack) -> None:
    engine = make_engine(settings)
    stack.callback(engine.dispose)
    key = lock_id(name)
    try:
        conn = engine.connect().execution_options(isolation_level="AUTOCOMMIT")
        stack.callback(conn.close)
        for statement in _KEEPALIVES:
            conn.execute(text(statement))
        got = conn.execute(text("SELECT pg_try_advisory_lock(:k)"), {"k": key}).scalar_one()
        if not got:
            raise _busy(name, _postgres_holder(conn, key))
        stack.callback(_unlock_postgres, conn, key)
        # Named after the lock, so a refused process can tell who holds it.
        label = (APPLICATION_PREFIX + f"{name} ({_holder()})")[:63]
        conn.execute(text("SELECT set_config('application_name', :n, false)"), {"n": label})
    except DBAPIError as e:
        reason = reason_line(str(e.orig or e), 300)
        raise DatabaseUnavailable(
            f"cannot take the lock of run key {name!r} in {settings.redacted_url()}: {reason}",
            setting=DATABASE_SETTING,
        ) from e


def _unlock_postgres(conn: Connection, key: int) -> None:
    # Closing the connection frees the lock anyway; unlock first so a pooled or slow
    # close cannot keep it.
    with contextlib.suppress(DBAPIError):
        conn.execute(text("SELECT pg_advisory_unlock(:k)"), {"k": key})


def _postgres_holder(conn: Connection, key: int) -> str | None:
    """What the holding session says about itself (its application name, minus the prefix)."""
    try:
        found = conn.execute(
            text(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a "
                "ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
                "AND l.classid = :hi AND l.objid = :lo AND l.objsubid = 1"
            ),
            {"hi": (key >> 32) & 0xFFFFFFFF, "lo": key & 0xFFFFFFFF},
        ).scalar_one_or_none()
    except DBAPIError:
        return None
    if not found:
        return None
    text_ = str(found)
    if text_.startswith(APPLICATION_PREFIX) and "(" in text_:
        return text_[text_.index("(") + 1 :].rstrip(")")
    return text_


def lock_file(database: Path, name: str) -> Path:
    """The SQLite lock file of `name` beside `database`."""
    digest = hashlib.sha256(name.encode()).hexdigest()[:32]
    return database.with_name(database.name + ".locks") / f"{digest}.lock"


def _acquire_file(database: Path, name: str, stack: contextlib.ExitStack) -> None:
    path = lock_file(database, name)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise DatabaseUnavailable(
            f"cannot create the run-key lock file {path}: {e.strerror}", setting=DATABASE_SETTING
        ) from e
    stack.callback(os.close, fd)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or None
        raise _busy(name, holder) from None
    stack.callback(fcntl.flock, fd, fcntl.LOCK_UN)
    os.ftruncate(fd, 0)
    os.pwrite(fd, _holder().encode(), 0)


def _acquire_memory(name: str, stack: contextlib.ExitStack) -> None:
    with _memory_guard:
        if name in _memory_locks:
            raise _busy(name, f"pid {os.getpid()}")
        _memory_locks.add(name)

    def release() -> None:
        with _memory_guard:
            _memory_locks.discard(name)

    stack.callback(release)
