"""`epiflow collect` checks everything before it writes anything (issue 18 items 1 and 4,
issue 13 item 8): a misconfigured sandbox, a read-only database, a full object directory,
an unreachable or slow Prefect API, and bad options are each one line on stderr naming
the setting, exit code 2, and no `collection_run` row. Real CLI, real nsjail, SQLite.

The full-disk and immutable-file cases need root (a tmpfs mount, `chattr`); they skip
with the reason elsewhere.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import text

from storage.db import make_engine
from storage.settings import DatabaseSettings
from tests.cli.local import cli_env, epiflow, local_prefect_home, one_error_line
from tests.services.postgres import free_port

COLLECT = ["collect", "--tasks", "1", "--templates", "csv_to_json", "--run-key", "pre", "--json"]


@pytest.fixture
def prefect_home() -> Iterator[Path]:
    with local_prefect_home() as home:
        yield home


@pytest.fixture
def env(tmp_path: Path, prefect_home: Path) -> dict[str, str]:
    env = cli_env(tmp_path, prefect_home)
    assert epiflow(env, "db", "upgrade", cwd=tmp_path).returncode == 0
    return env


def run_rows(url: str) -> int:
    engine = make_engine(DatabaseSettings(url=url))
    try:
        with engine.connect() as conn:
            return int(conn.execute(text("SELECT COUNT(*) FROM collection_run")).scalar_one())
    finally:
        engine.dispose()


def assert_nothing_written(env: dict[str, str], tmp_path: Path) -> None:
    assert run_rows(env["EPIFLOW_DATABASE_URL"]) == 0
    objects = Path(env["EPIFLOW_OBJECTS_URL"])
    assert not (objects / "episodes").exists()


def root_with_mounts() -> bool:
    return os.geteuid() == 0 and shutil.which("mount") is not None


@pytest.mark.parametrize(
    ("variables", "setting"),
    [
        ({"EPIFLOW_SANDBOX_NSJAIL_PATH": "/nonexistent"}, "EPIFLOW_SANDBOX_NSJAIL_PATH"),
        ({"EPIFLOW_SANDBOX_CGROUPS": "bogus"}, "EPIFLOW_SANDBOX_CGROUPS"),
        (
            {"EPIFLOW_SANDBOX_CGROUPS": "required", "EPIFLOW_SANDBOX_CGROUP_ROOT": "/nonexistent"},
            "EPIFLOW_SANDBOX_CGROUPS",
        ),
        ({"EPIFLOW_SANDBOX_PYTHON_PATH": "/no/python3"}, "EPIFLOW_SANDBOX_PYTHON_PATH"),
    ],
    ids=["nsjail-path", "cgroups-bogus", "cgroups-required", "python-path"],
)
def test_misconfigured_sandbox_writes_nothing(
    env: dict[str, str], tmp_path: Path, variables: dict[str, str], setting: str
) -> None:
    line = one_error_line(epiflow({**env, **variables}, *COLLECT, cwd=tmp_path))
    assert setting in line, line
    assert_nothing_written(env, tmp_path)


def test_read_only_database_uri(env: dict[str, str], tmp_path: Path) -> None:
    path = env["EPIFLOW_DATABASE_URL"].removeprefix("sqlite:///")
    read_only = {"EPIFLOW_DATABASE_URL": f"sqlite:///file:{path}?mode=ro&uri=true"}
    line = one_error_line(epiflow({**env, **read_only}, *COLLECT, cwd=tmp_path))
    assert "does not take writes" in line and "EPIFLOW_DATABASE_URL" in line, line
    assert_nothing_written(env, tmp_path)


def test_immutable_database_file(env: dict[str, str], tmp_path: Path) -> None:
    db = Path(env["EPIFLOW_DATABASE_URL"].removeprefix("sqlite:///"))
    if os.geteuid() != 0 or not shutil.which("chattr"):
        pytest.skip("needs root and chattr to make the database file immutable")
    if subprocess.run(["chattr", "+i", str(db)], capture_output=True).returncode != 0:
        pytest.skip(f"the filesystem under {db} does not support chattr +i")
    try:
        line = one_error_line(epiflow(env, *COLLECT, cwd=tmp_path))
    finally:
        subprocess.run(["chattr", "-i", str(db)], check=True)
    assert "readonly database" in line and "EPIFLOW_DATABASE_URL" in line, line
    assert_nothing_written(env, tmp_path)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 256 KiB tmpfs (root only)."""
    if not root_with_mounts():
        pytest.skip("needs root to mount a small tmpfs as a full disk")
    mount = tmp_path / "small"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def fill(disk: Path) -> None:
    fd = os.open(disk / "filler", os.O_WRONLY | os.O_CREAT, 0o644)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError:  # full
        pass
    finally:
        os.close(fd)


def test_full_object_directory(env: dict[str, str], tmp_path: Path, small_disk: Path) -> None:
    objects = small_disk / "objects"
    objects.mkdir()
    fill(small_disk)
    line = one_error_line(
        epiflow({**env, "EPIFLOW_OBJECTS_URL": str(objects)}, *COLLECT, cwd=tmp_path)
    )
    assert "No space left on device" in line and "EPIFLOW_OBJECTS_URL" in line, line
    assert run_rows(env["EPIFLOW_DATABASE_URL"]) == 0
    assert not (objects / "episodes").exists()


def test_export_to_a_full_disk_is_one_line(
    env: dict[str, str], tmp_path: Path, small_disk: Path
) -> None:
    """An OSError of a full disk anywhere in a command is one line (cli.app.main)."""
    imported = tmp_path / "one.jsonl"
    imported.write_text(
        json.dumps({"messages": [{"role": "user", "content": "x" * 200_000}]}) + "\n"
    )
    imported_ok = epiflow(
        env, "import", "--format", "openai", "--run-key", "imported", str(imported), cwd=tmp_path
    )
    assert imported_ok.returncode == 0, imported_ok.stderr
    fill(small_disk)
    out = small_disk / "export.jsonl"
    result = epiflow(
        env, "export", "--run", "imported", "--format", "openai", "--out", str(out), cwd=tmp_path
    )
    line = one_error_line(result)
    assert "No space left on device" in line and str(small_disk) in line, line


def test_unreachable_prefect_api(env: dict[str, str], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/api"
    line = one_error_line(epiflow({**env, "EPIFLOW_PREFECT_API_URL": url}, *COLLECT, cwd=tmp_path))
    assert "EPIFLOW_PREFECT_API_URL" in line and url in line, line
    assert_nothing_written(env, tmp_path)


@pytest.mark.slow
def test_local_prefect_server_too_slow_to_start(
    env: dict[str, str], tmp_path: Path, prefect_home: Path
) -> None:
    """Issue 13 item 8: a Prefect API that does not come up in time is one line naming
    the setting, exit 2, nothing written (the server it started stops when idle; the
    fixture stops it now)."""
    slow = {"EPIFLOW_PREFECT_START_TIMEOUT_S": "0.5"}
    line = one_error_line(epiflow({**env, **slow}, *COLLECT, cwd=tmp_path))
    assert "EPIFLOW_PREFECT_START_TIMEOUT_S" in line and "server.log" in line, line
    assert_nothing_written(env, tmp_path)


def test_bad_fault_json_names_every_field(env: dict[str, str], tmp_path: Path) -> None:
    faults = json.dumps({"latency_p": 2, "bogus": 1})
    line = one_error_line(epiflow(env, "collect", "--faults", faults, cwd=tmp_path))
    assert "--faults" in line and "latency_p" in line and "bogus" in line, line
    assert "less than or equal to 1" in line and "Extra inputs" in line, line


def test_every_invalid_setting_is_named(env: dict[str, str], tmp_path: Path) -> None:
    bad = {"EPIFLOW_SANDBOX_CGROUPS": "bogus", "EPIFLOW_SANDBOX_START_TIMEOUT_S": "-1"}
    line = one_error_line(epiflow({**env, **bad}, *COLLECT, cwd=tmp_path))
    assert "EPIFLOW_SANDBOX_CGROUPS" in line and "EPIFLOW_SANDBOX_START_TIMEOUT_S" in line, line


def test_model_endpoint_with_nothing_listening(env: dict[str, str], tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/v1"
    line = one_error_line(epiflow(env, *COLLECT, "--policy", f"openai:{url}#m", cwd=tmp_path))
    assert f"the model endpoint {url} cannot be reached" in line and "--policy" in line, line
    assert_nothing_written(env, tmp_path)
