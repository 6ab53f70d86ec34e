"""Helpers for tests that run `epiflow` as a user does: a subprocess, real nsjail, and the
shared local Prefect server (no `EPIFLOW_PREFECT_API_URL`) in a Prefect home of the test's
own, stopped at the end."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from sqlalchemy import Engine

from core.owner import process_start_ticks
from orchestration.prefect_server import server_dir, status, stop
from tests.services.prefect_db import seed_prefect_home

EPIFLOW = str(Path(sys.executable).parent / "epiflow")
CGROUP_ROOTS = [Path("/sys/fs/cgroup/memory"), Path("/sys/fs/cgroup/pids")]


@contextmanager
def local_prefect_home(prefix: str = "epiflow-local-prefect-") -> Iterator[Path]:
    """A Prefect home for the shared local server of these tests, its database migrated
    (`tests.services.prefect_db`); the server (if any) is stopped and the home removed
    afterwards."""
    home = seed_prefect_home(Path(tempfile.mkdtemp(prefix=prefix)))
    try:
        yield home
    finally:
        stop(server_dir(home), timeout_s=30)
        shutil.rmtree(home, ignore_errors=True)


@contextmanager
def sandbox_state_dir() -> Iterator[Path]:
    """A sandbox state dir jails can mount (pytest's tmp root is 0700), and its marker for
    finding this test's jail processes."""
    state = Path(tempfile.mkdtemp(prefix="epiflow-cli-state-"))
    state.chmod(0o755)
    try:
        yield state
    finally:
        shutil.rmtree(state, ignore_errors=True)


def cli_env(
    tmp_path: Path, prefect_home: Path, state_dir: Path | None = None, **extra: str
) -> dict[str, str]:
    """The environment of a user's shell: no EPIFLOW_* or PREFECT_API_* of the test run,
    SQLite and an object directory under `tmp_path`, the local server of `prefect_home`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(
        PREFECT_HOME=str(prefect_home),
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'cli.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
        # Generous: four collections and other engineers' suites share two cores.
        EPIFLOW_PREFECT_START_TIMEOUT_S="300",
        EPIFLOW_PREFECT_LOCAL_IDLE_S="120",
    )
    if state_dir is not None:
        env["EPIFLOW_SANDBOX_STATE_DIR"] = str(state_dir)
    env.update(extra)
    return env


def bare_env(**settings: str) -> dict[str, str]:
    """This process's environment without the test run's EPIFLOW_* and PREFECT_API_*
    variables, with `settings` (EPIFLOW_* names) added: a victim command's environment."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(settings)
    return env


def stored_episodes(engine: Engine) -> int:
    """How many episodes the database holds."""
    from sqlalchemy import func, select

    from models import Episode

    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Episode)).scalar_one())


def epiflow(
    env: dict[str, str], *args: str, cwd: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EPIFLOW, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=timeout
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    """The single stderr line of a user error (exit code 2, no traceback)."""
    assert result.returncode == 2, (result.returncode, result.stderr[-3000:])
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def last_line(text: str) -> str:
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return lines[-1] if lines else ""


def processes_mentioning(marker: str) -> list[int]:
    """Host processes whose command line mentions `marker` (e.g. a sandbox state dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if marker in cmdline and process_start_ticks(int(proc.name)) is not None:
            found.append(int(proc.name))
    return found


def process_group(pgid: int) -> list[int]:
    """Live processes in process group `pgid`."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            stat = (proc / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rfind(")") + 2 :].split()
        if fields[0] != "Z" and int(fields[2]) == pgid:
            found.append(int(proc.name))
    return found


def cgroups(parent: str = "NSJAIL") -> set[str]:
    """Jail cgroups under `parent` (cgroup v1 memory and pids)."""
    return {
        p.name
        for root in CGROUP_ROOTS
        if (root / parent).is_dir()
        for p in (root / parent).iterdir()
        if p.is_dir()
    }


@contextmanager
def private_cgroup_parent() -> Iterator[str]:
    """A cgroup parent of the test's own (`EPIFLOW_SANDBOX_CGROUP_PARENT`): other processes
    on the machine start jails under the shared one, so only this one tells whether the
    test's jails left cgroups behind. Removed afterwards when empty."""
    name = f"NSJAIL-test-{uuid.uuid4().hex[:8]}"
    try:
        yield name
    finally:
        for root in CGROUP_ROOTS:
            with contextlib.suppress(OSError):
                (root / name).rmdir()


def wait_until(predicate: Callable[[], bool], timeout: float, interval: float = 0.1) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
        time.sleep(interval)
    return bool(predicate())


def server_pid(home: Path) -> int | None:
    """The local server of `home`, when one runs."""
    return status(server_dir(home)).pid
