"""A throwaway PostgreSQL cluster started from the installed binaries (initdb in a temp dir).

Password authentication (scram) on loopback TCP, so tests can check wrong credentials.
Runs the server as the `postgres` system user when the tests run as root (initdb refuses
to run as root).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

SUPERUSER_PASSWORD = "epiflow-test-superuser"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def find_pg_bin() -> Path | None:
    """Directory holding initdb/pg_ctl: EPIFLOW_PG_BIN, PATH, or /usr/lib/postgresql/*/bin."""
    explicit = os.environ.get("EPIFLOW_PG_BIN")
    if explicit:
        return Path(explicit)
    on_path = shutil.which("initdb")
    if on_path:
        return Path(on_path).parent
    candidates = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), reverse=True)
    return Path(candidates[0]).parent if candidates else None


def pg_bin_or_skip() -> Path:
    """The PostgreSQL binaries; skips the test loudly when they are missing (fails it under
    EPIFLOW_REQUIRE_POSTGRES=1)."""
    import pytest

    bin_dir = find_pg_bin()
    if bin_dir is None or not (bin_dir / "initdb").exists():
        reason = (
            "PostgreSQL binaries (initdb, pg_ctl) not found: install the `postgresql` package "
            "or set EPIFLOW_PG_BIN; PostgreSQL tests are NOT running"
        )
        if os.environ.get("EPIFLOW_REQUIRE_POSTGRES") == "1":
            pytest.fail(reason + " (EPIFLOW_REQUIRE_POSTGRES=1)")
        pytest.skip(reason)
    return bin_dir


@dataclass
class PostgresCluster:
    """A running cluster; `url(db)` gives a SQLAlchemy URL as the superuser."""

    host: str
    port: int
    password: str
    data_dir: Path | None = None
    """The cluster's data directory (its `postmaster.pid` names the server process)."""

    def postmaster_pid(self) -> int:
        """The server's main process (its backends and workers are its children)."""
        assert self.data_dir is not None, "a cluster started by running_cluster"
        return int((self.data_dir / "postmaster.pid").read_text().split()[0])

    def url(
        self, database: str = "postgres", *, user: str = "postgres", password: str | None = None
    ) -> str:
        pw = self.password if password is None else password
        return f"postgresql+psycopg://{user}:{pw}@{self.host}:{self.port}/{database}"

    def create_database(self, template: str | None = None) -> str:
        """A new database: empty, or a copy of `template` (CREATE DATABASE … TEMPLATE, a
        file-level copy; nobody may be connected to the template meanwhile)."""
        name = f"t_{uuid.uuid4().hex[:12]}"
        self.execute(f'CREATE DATABASE "{name}"' + (f' TEMPLATE "{template}"' if template else ""))
        return name

    def replace_database(self, name: str, template: str) -> None:
        """Drop database `name` and create it again as a copy of `template`."""
        self.execute(f'DROP DATABASE "{name}"')
        self.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')

    def execute(self, sql: str) -> None:
        """Run one statement as the superuser outside a transaction (database DDL)."""
        import psycopg

        with psycopg.connect(
            host=self.host,
            port=self.port,
            user="postgres",
            password=self.password,
            dbname="postgres",
            autocommit=True,
        ) as conn:
            conn.execute(sql)


@contextmanager
def running_cluster(bin_dir: Path) -> Iterator[PostgresCluster]:
    as_root = os.geteuid() == 0
    user = "postgres" if as_root else None
    root = Path(tempfile.mkdtemp(prefix="epiflow-pg-"))
    data, sock, log = root / "data", root / "sock", root / "server.log"
    sock.mkdir()
    pwfile = root / "pw"
    pwfile.write_text(SUPERUSER_PASSWORD + "\n")
    if as_root:
        shutil.chown(root, user="postgres")
        for p in (sock, pwfile):
            shutil.chown(p, user="postgres")
    port = free_port()
    try:
        subprocess.run(
            [
                str(bin_dir / "initdb"),
                "-D",
                str(data),
                "-U",
                "postgres",
                "-A",
                "scram-sha-256",
                f"--pwfile={pwfile}",
                "-E",
                "UTF8",
                "--locale=C",
                "--no-sync",
            ],
            check=True,
            capture_output=True,
            user=user,
        )
        options = (
            f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off "
            "-c synchronous_commit=off -c full_page_writes=off -c max_connections=200"
        )
        subprocess.run(
            [
                str(bin_dir / "pg_ctl"),
                "-D",
                str(data),
                "-o",
                options,
                "-l",
                str(log),
                "-w",
                "-t",
                "60",
                "start",
            ],
            check=True,
            capture_output=True,
            user=user,
        )
        yield PostgresCluster(
            host="127.0.0.1", port=port, password=SUPERUSER_PASSWORD, data_dir=data
        )
    finally:
        if data.exists():
            subprocess.run(
                [str(bin_dir / "pg_ctl"), "-D", str(data), "-m", "immediate", "-w", "stop"],
                capture_output=True,
                user=user,
                check=False,
            )
        shutil.rmtree(root, ignore_errors=True)
