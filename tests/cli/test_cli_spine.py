"""The `epiflow` CLI as a user runs it (a real subprocess): db commands, demo, bad input.

Bad input gets one line on stderr naming the setting to fix, exit code 2, and nothing
half-written.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services.postgres import PostgresCluster, free_port

EPIFLOW = str(Path(sys.executable).parent / "epiflow")


def run(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return run_for(args, cwd, env, timeout=600)


def run_for(
    args: list[str], cwd: Path, env: dict[str, str], *, timeout: float
) -> subprocess.CompletedProcess[str]:
    full_env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    # The defaults land in EPIFLOW_HOME: the test's own, never the developer's ~/.epiflow.
    full_env["EPIFLOW_HOME"] = str(cwd / ".epiflow")
    full_env.update(env)
    return subprocess.run(
        [EPIFLOW, *args], cwd=cwd, env=full_env, capture_output=True, text=True, timeout=timeout
    )


def one_error_line(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    return lines[0]


def test_db_upgrade_current_downgrade(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'x.db'}"
    current = run(["db", "current", "--json"], tmp_path, EPIFLOW_DATABASE_URL=url)
    from storage.migrate import head_revision

    head = head_revision()
    assert json.loads(current.stdout) == {"current": None, "head": head, "up_to_date": False}
    up = run(["db", "upgrade"], tmp_path, EPIFLOW_DATABASE_URL=url)
    assert up.returncode == 0 and f"empty -> {head}" in up.stdout
    assert json.loads(run(["db", "current", "--json"], tmp_path, EPIFLOW_DATABASE_URL=url).stdout)[
        "up_to_date"
    ]
    down = run(["db", "downgrade", "--revision", "base"], tmp_path, EPIFLOW_DATABASE_URL=url)
    assert down.returncode == 0 and f"{head} -> empty" in down.stdout


@pytest.mark.slow
@pytest.mark.timeout(1800)
def test_demo_on_embedded_defaults(tmp_path: Path) -> None:
    """`epiflow demo --json` runs the nightly chain on embedded defaults (SQLite, local
    objects, the shared local Prefect server) and every path it prints exists."""
    # The demo trains for minutes (its recipe's budget); the rest of the chain takes a few more.
    result = run_for(["demo", "--json"], tmp_path, {}, timeout=1500)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout)
    assert set(summary) >= {
        "episodes",
        "success_rate",
        "qc",
        "training_run_id",
        "evaluation",
        "paths",
    }
    assert summary["episodes"] > 0 and 0.0 < summary["success_rate"] <= 1.0
    assert summary["qc"]["batch_passed"] and summary["qc"]["triggered_training"]
    assert summary["training_run_id"] and summary["evaluation"]["completion_rate"] is not None
    # The demo teaches its model: on held-out instances (seeds disjoint from training) the
    # trained checkpoint completes more tasks than its base. Relative, never a fixed rate:
    # the demo's budget is wall time on a shared machine.
    evaluation = summary["evaluation"]
    assert evaluation["completion_rate"] > evaluation["base_completion_rate"], evaluation
    assert "bench/loop.py" in summary["full_loop"]
    # Never silent for long (core/progress.py): the stage lines, then training's (steps,
    # loss, ETA) and evaluation's (episodes) on stderr. Their spacing is not asserted (time).
    progress = result.stderr
    assert "demo: 1/4 stages" in progress and "demo: 4/4 stages (100%)" in progress
    assert "train sft: " in progress and ", loss " in progress and ", ETA " in progress
    assert "evaluate eval-" in progress and " episodes (" in progress
    paths = summary["paths"]
    assert Path(paths["database"]).is_file()
    assert Path(paths["objects"]).is_dir()
    assert Path(paths["gx_data_docs"]).is_file()
    for which in ("success_episode", "failure_episode"):
        shown = run(["show", paths[which]], tmp_path)
        assert shown.returncode == 0 and paths[which] in shown.stdout


def test_unreachable_database(tmp_path: Path) -> None:
    url = f"postgresql+psycopg://u:hunter2secret@127.0.0.1:{free_port()}/db"
    line = one_error_line(run(["db", "upgrade"], tmp_path, EPIFLOW_DATABASE_URL=url))
    assert "EPIFLOW_DATABASE_URL" in line and "hunter2secret" not in line


def test_wrong_credentials(tmp_path: Path, pg_cluster: PostgresCluster) -> None:
    url = pg_cluster.url("postgres", password="wrong-password-xyz")
    line = one_error_line(run(["db", "current"], tmp_path, EPIFLOW_DATABASE_URL=url))
    assert "EPIFLOW_DATABASE_URL" in line and "password" in line
    assert "wrong-password-xyz" not in line


def test_invalid_url_does_not_echo_it(tmp_path: Path) -> None:
    line = one_error_line(
        run(["db", "current"], tmp_path, EPIFLOW_DATABASE_URL="postgresql://u:s3cr3t@@h:port/x")
    )
    assert line.startswith("error: EPIFLOW_DATABASE_URL") and "s3cr3t" not in line


@pytest.mark.parametrize(
    ("url", "needle"),
    [
        ("postgresql+nodriver://u:p@h/db", "unknown driver 'nodriver'"),
        ("mysql://u:p@h/db", "supports postgresql"),
    ],
)
def test_an_unsupported_database_url_is_one_line(tmp_path: Path, url: str, needle: str) -> None:
    line = one_error_line(run(["db", "current"], tmp_path, EPIFLOW_DATABASE_URL=url))
    assert "EPIFLOW_DATABASE_URL" in line and needle in line, line


def test_schema_older_than_code(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'old.db'}"
    line = one_error_line(run(["db", "orphans"], tmp_path, EPIFLOW_DATABASE_URL=url))
    assert "epiflow db upgrade" in line and "EPIFLOW_DATABASE_URL" in line


def test_unwritable_object_directory_writes_nothing(tmp_path: Path) -> None:
    (tmp_path / "blocker").write_text("a file, not a directory")
    line = one_error_line(
        run(["demo"], tmp_path, EPIFLOW_OBJECTS_URL=str(tmp_path / "blocker" / "objects"))
    )
    assert "EPIFLOW_OBJECTS_URL" in line
    assert not (tmp_path / ".epiflow" / "epiflow.db").exists()


@pytest.mark.s3
def test_missing_bucket_writes_nothing(tmp_path: Path, s3_server) -> None:
    env = {
        "EPIFLOW_OBJECTS_URL": "s3://missing-bucket",
        "EPIFLOW_OBJECTS_ENDPOINT": s3_server.endpoint,
        "EPIFLOW_OBJECTS_ACCESS_KEY": "k",
        "EPIFLOW_OBJECTS_SECRET_KEY": "very-secret-key",
        "EPIFLOW_OBJECTS_SECURE": "false",
    }
    result = run(["demo"], tmp_path, **env)
    line = one_error_line(result)
    assert "missing-bucket" in line and "EPIFLOW_OBJECTS_URL" in line
    assert "very-secret-key" not in result.stderr + result.stdout
    assert not (tmp_path / ".epiflow" / "epiflow.db").exists()


def test_s3_without_keys_is_one_line(tmp_path: Path) -> None:
    env = {
        "EPIFLOW_OBJECTS_URL": "s3://epiflow",
        "EPIFLOW_OBJECTS_ENDPOINT": "127.0.0.1:9",
        "EPIFLOW_OBJECTS_SECURE": "false",
    }
    line = one_error_line(run(["demo"], tmp_path, **env))
    assert "EPIFLOW_OBJECTS_ACCESS_KEY" in line and "EPIFLOW_OBJECTS_ANONYMOUS" in line
    assert not (tmp_path / ".epiflow" / "epiflow.db").exists()
