"""A training killed outright (SIGKILL) cannot close its `training_run` row: a real child
process opens one through `start_training_run` and is SIGKILLed; the next training on the
host marks it `crashed` and its GRPO rollout run `interrupted` (SQLite and PostgreSQL), and
so does `epiflow db orphans --fix`, while a live process's row and another host's stay
`running`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from models import Dataset, TrainingRun
from storage.grpo_rollouts import rollout_run_key
from storage.run_reads import run_status
from storage.runs import open_run
from training.registry import mark_crashed_training_runs, start_training_run

ROOT = Path(__file__).resolve().parents[2]
EPIFLOW = str(Path(sys.executable).parent / "epiflow")

CHILD = """
import sys, time, uuid
from storage.db import make_engine
from storage.settings import DatabaseSettings
from training.registry import start_training_run
engine = make_engine(DatabaseSettings(url=sys.argv[1]))
run_id = start_training_run(
    engine, dataset_id=uuid.UUID(sys.argv[2]), algo="sft", base_model="tiny", config={}
)
print(run_id, flush=True)
# The trainer lives until the test kills it: a workload, not a wait.
time.sleep(600)
"""


def _dataset(engine: Engine) -> uuid.UUID:
    dataset_id = uuid.uuid4()
    with Session(engine) as session:
        session.add(
            Dataset(
                id=dataset_id,
                kind="sft",
                filter={},
                manifest={},
                sha256="0" * 64,
                object_key=f"datasets/{dataset_id}/sft.parquet",
            )
        )
        session.commit()
    return dataset_id


def _status(engine: Engine, run_id: uuid.UUID) -> tuple[str, str | None]:
    with Session(engine) as session:
        row = session.get(TrainingRun, run_id)
        assert row is not None
        return row.status, row.error


def _rollout_run(engine: Engine, training_run: uuid.UUID) -> uuid.UUID:
    """A running rollout collection run of `training_run` (`grpo-rollouts-<id>`)."""
    return open_run(
        engine,
        run_key=rollout_run_key(str(training_run)),
        suite="builtin",
        policy="hf:grpo",
        parameters={},
        sandbox_spec={},
        fault_profile={},
    )


@pytest.fixture
def killed_run(migrated_engine: Engine) -> Iterator[tuple[uuid.UUID, uuid.UUID]]:
    """(a training run whose process was SIGKILLed while running, its dataset)."""
    dataset_id = _dataset(migrated_engine)
    url = migrated_engine.url.render_as_string(hide_password=False)
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, url, str(dataset_id)],
        stdout=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None
        with child.stdout:
            run_id = uuid.UUID(child.stdout.readline().strip())
        assert mark_crashed_training_runs(migrated_engine) == []  # its owner is alive
        assert _status(migrated_engine, run_id) == ("running", None)
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(timeout=60)
    assert _status(migrated_engine, run_id)[0] == "running"  # nothing could close it
    yield run_id, dataset_id


@pytest.mark.slow(reason="starts a training run in a child interpreter and kills it")
def test_the_next_training_marks_a_killed_one_crashed(
    migrated_engine: Engine, killed_run: tuple[uuid.UUID, uuid.UUID]
) -> None:
    killed, dataset_id = killed_run
    foreign = uuid.uuid4()  # another host's running training: only that host can judge it
    with Session(migrated_engine) as session:
        session.add(
            TrainingRun(
                id=foreign,
                dataset_id=dataset_id,
                algo="sft",
                base_model="tiny",
                config={},
                metrics={},
                owner="some-other-host 1 1",
            )
        )
        session.commit()

    # A GRPO training's rollouts are a collection run keyed by its training run.
    killed_rollouts = _rollout_run(migrated_engine, killed)
    foreign_rollouts = _rollout_run(migrated_engine, foreign)

    mine = start_training_run(
        migrated_engine, dataset_id=dataset_id, algo="sft", base_model="tiny", config={}
    )
    status, error = _status(migrated_engine, killed)
    assert status == "crashed" and error is not None and "ended without closing" in error
    assert _status(migrated_engine, mine) == ("running", None)  # this process is alive
    assert _status(migrated_engine, foreign) == ("running", None)
    assert run_status(migrated_engine, killed_rollouts) == "interrupted"  # no one re-runs it
    assert run_status(migrated_engine, foreign_rollouts) == "running"
    with Session(migrated_engine) as session:
        row = session.get(TrainingRun, killed)
        assert row is not None and row.ended_at is not None


def test_db_orphans_fix_marks_it_crashed(
    migrated_engine: Engine, killed_run: tuple[uuid.UUID, uuid.UUID], tmp_path: Path
) -> None:
    killed, _ = killed_run
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(
        PYTHONPATH=str(ROOT),
        EPIFLOW_HOME=str(tmp_path / "home"),
        EPIFLOW_DATABASE_URL=migrated_engine.url.render_as_string(hide_password=False),
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
    )

    def orphans(*flags: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EPIFLOW, "db", "orphans", *flags],
            env=env,
            capture_output=True,
            text=True,
            timeout=600,
        )

    listed = orphans()
    assert listed.returncode == 0, listed.stderr
    assert f"crashed: training_run {killed}" in listed.stdout.splitlines()
    assert _status(migrated_engine, killed)[0] == "running"  # listed, not changed

    fixed = orphans("--fix")
    assert fixed.returncode == 0, fixed.stderr
    assert "1 training run(s) of dead processes marked crashed" in fixed.stderr
    assert _status(migrated_engine, killed)[0] == "crashed"
    again = orphans("--fix")
    assert again.returncode == 0 and "crashed:" not in again.stdout
