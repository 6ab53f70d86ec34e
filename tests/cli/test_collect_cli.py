"""`epiflow collect / show / export / import / replay` as a user runs them (subprocesses),
against the Prefect harness server, real nsjail and SQLite + a local object directory."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
from sqlalchemy import text

from storage.db import make_engine
from storage.settings import DatabaseSettings

EPIFLOW = str(Path(sys.executable).parent / "epiflow")


@pytest.fixture
def cli_env(tmp_path: Path, prefect_api_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'cli.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
        EPIFLOW_PREFECT_API_URL=prefect_api_url,
    )
    return env


def epiflow(env: dict[str, str], *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [EPIFLOW, *args], env=env, cwd=cwd, capture_output=True, text=True, timeout=300
    )


def test_collect_show_export_import_replay(cli_env: dict[str, str], tmp_path: Path) -> None:
    assert epiflow(cli_env, "db", "upgrade", cwd=tmp_path).returncode == 0
    done = epiflow(
        cli_env,
        "collect",
        "--suite",
        "builtin",
        "--policy",
        "scripted:noisy",
        "--tasks",
        "1",
        "--rollouts",
        "2",
        "--concurrency",
        "4",
        "--templates",
        "csv_to_json,log_errors,dir_tree",
        "--faults",
        "light",
        "--run-key",
        "cli-run",
        "--json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert set(summary) >= {
        "run_id",
        "episodes",
        "steps",
        "by_status",
        "success_rate",
        "duration_s",
    }
    assert summary["episodes"] == 6 and sum(summary["by_status"].values()) == 6

    engine = make_engine(DatabaseSettings(url=cli_env["EPIFLOW_DATABASE_URL"]))
    with engine.connect() as conn:
        episode_id = conn.execute(
            text("SELECT episode_id FROM episode_summary LIMIT 1")
        ).scalar_one()
    import uuid

    eid = str(uuid.UUID(str(episode_id)))

    shown = epiflow(cli_env, "show", eid, cwd=tmp_path)
    assert shown.returncode == 0 and "step 0" in shown.stdout and "<tool_call" in shown.stdout

    atif = tmp_path / "run.atif.jsonl"
    assert (
        epiflow(
            cli_env,
            "export",
            "--run",
            "cli-run",
            "--format",
            "atif",
            "--out",
            str(atif),
            cwd=tmp_path,
        ).returncode
        == 0
    )
    docs = [json.loads(line) for line in atif.read_text().splitlines()]
    assert len(docs) == 6 and all(d["steps"] for d in docs)
    openai = epiflow(cli_env, "export", "--run", "cli-run", "--format", "openai", cwd=tmp_path)
    assert (
        openai.returncode == 0
        and json.loads(openai.stdout.splitlines()[0])["messages"][0]["role"] == "system"
    )
    parquet = tmp_path / "steps.parquet"
    assert (
        epiflow(
            cli_env,
            "export",
            "--run",
            "cli-run",
            "--format",
            "parquet",
            "--out",
            str(parquet),
            cwd=tmp_path,
        ).returncode
        == 0
    )
    assert pl.read_parquet(parquet).height == summary["steps"]

    # Import into a second, empty database: the same episodes come back.
    other = {
        **cli_env,
        "EPIFLOW_DATABASE_URL": f"sqlite:///{tmp_path / 'other.db'}",
        "EPIFLOW_OBJECTS_URL": str(tmp_path / "o2"),
    }
    assert epiflow(other, "db", "upgrade", cwd=tmp_path).returncode == 0
    imported = epiflow(other, "import", "--format", "atif", str(atif), "--json", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert len(json.loads(imported.stdout)["inserted"]) == 6
    again = epiflow(other, "import", "--format", "atif", str(atif), "--json", cwd=tmp_path)
    assert json.loads(again.stdout)["inserted"] == []

    replayed = epiflow(cli_env, "replay", eid, "--json", cwd=tmp_path)
    assert replayed.returncode == 0, replayed.stderr
    report = json.loads(replayed.stdout)
    assert report["steps"] >= 1 and report["identical_steps"] == report["steps"], report
    with engine.connect() as conn:
        rate = conn.execute(
            text(
                "SELECT reproducibility_rate FROM reproducibility_by_suite WHERE suite = 'builtin'"
            )
        ).scalar_one()
    assert rate == 1.0
    engine.dispose()


def test_bad_arguments_get_one_line(cli_env: dict[str, str], tmp_path: Path) -> None:
    assert epiflow(cli_env, "db", "upgrade", cwd=tmp_path).returncode == 0
    for args, needle in [
        (["collect", "--suite", "no-such-suite"], "no-such-suite"),
        (["collect", "--faults", "catastrophic"], "--faults"),
        (["collect", "--policy", "telepathy:x"], "--policy"),
        (["export", "--run", "never-ran"], "never-ran"),
    ]:
        result = epiflow(cli_env, *args, cwd=tmp_path)
        assert result.returncode == 2, (args, result.stderr)
        lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and needle in lines[0], (args, result.stderr)
