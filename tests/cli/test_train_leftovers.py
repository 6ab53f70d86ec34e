"""What a stopped or killed `epiflow train` leaves behind (a real subprocess, real TRL on
a tiny local model, SQLite): SIGKILL cannot clean up, so its work folder (model copies)
and its `running` training_run stay — until the next training starts, which removes the
folder and marks the row `crashed`; SIGTERM and SIGINT stop the training at its next log
event, close its row `failed`, remove its folder and exit 143 / 130 with one line."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, select
from sqlmodel import col

from collection.request import CollectRequest
from collection.runner import collect_in_process
from models import TrainingRun
from storage.objects import LocalObjectStore
from tests.cli.local import bare_env, last_line, wait_until
from tests.services.processes import kill_tree

EPIFLOW = str(Path(sys.executable).parent / "epiflow")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _runs(engine: Engine) -> dict[uuid.UUID, tuple[str, str | None, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(
                col(TrainingRun.id),
                col(TrainingRun.status),
                col(TrainingRun.owner),
                col(TrainingRun.error),
            )
        ).all()
    return {r[0]: (r[1], r[2], r[3]) for r in rows}


def _folders_of(tmp: Path, pid: int) -> list[Path]:
    found = []
    for folder in tmp.glob("epiflow-train-*"):
        owner = folder / ".owner"
        if owner.is_file() and owner.read_text().split()[1] == str(pid):
            found.append(folder)
    return found


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_killed_stopped_and_interrupted_trainings_leave_nothing_behind(
    migrated_engine: Engine, prefect_api_url: str, tmp_path: Path
) -> None:
    objects = tmp_path / "objects"
    request = CollectRequest(
        run_key="train-src", tasks=2, rollouts=1, concurrency=4, templates=["csv_to_json"]
    )
    asyncio.run(
        collect_in_process(request, engine=migrated_engine, store=LocalObjectStore(objects))
    )
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = bare_env(
        PYTHONPATH=str(ROOT),
        TMPDIR=str(tmp),
        EPIFLOW_HOME=str(tmp_path / "home"),
        EPIFLOW_DATABASE_URL=migrated_engine.url.render_as_string(hide_password=False),
        EPIFLOW_OBJECTS_URL=str(objects),
        EPIFLOW_PREFECT_API_URL=prefect_api_url,
        EPIFLOW_TRAINING_MAX_STEPS="1000000",  # trains until stopped
    )

    def start(log: Path) -> tuple[subprocess.Popen[bytes], uuid.UUID]:
        known = set(_runs(migrated_engine))
        with log.open("wb") as sink:
            victim = subprocess.Popen(
                [EPIFLOW, "train", "--from-run", "train-src"],
                env=env,
                stdout=sink,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        started = wait_until(
            lambda: bool(set(_runs(migrated_engine)) - known) or victim.poll() is not None, 600
        )
        assert started and victim.poll() is None, log.read_text()[-3000:]
        (run_id,) = set(_runs(migrated_engine)) - known
        assert _folders_of(tmp, victim.pid), log.read_text()[-3000:]
        return victim, run_id

    killed, killed_run = start(tmp_path / "killed.log")
    kill_tree(killed.pid)
    killed.wait(timeout=60)
    (leftover,) = _folders_of(tmp, killed.pid)
    assert _runs(migrated_engine)[killed_run][0] == "running"  # nothing could close it

    for sig in (signal.SIGTERM, signal.SIGINT):
        log = tmp_path / f"{sig.name}.log"
        victim, run_id = start(log)
        # This training's start swept the killed one's folder and marked its row.
        assert not leftover.exists()
        status, _, error = _runs(migrated_engine)[killed_run]
        assert status == "crashed" and error is not None and str(killed.pid) in error
        victim.send_signal(sig)
        code = victim.wait(timeout=600)
        output = log.read_text()
        assert code == 128 + sig, output[-3000:]
        assert last_line(output).startswith(f"interrupted by {sig.name}: training stopped")
        assert "Traceback" not in output, output[-3000:]
        assert _folders_of(tmp, victim.pid) == []
        status, _, error = _runs(migrated_engine)[run_id]
        assert status == "failed" and error is not None, error
    assert list(tmp.glob("epiflow-train-*")) == []
