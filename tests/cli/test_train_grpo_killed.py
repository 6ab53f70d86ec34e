"""A GRPO training killed outright (SIGKILL, mid-training: after its first batch of
rollouts was stored, while it runs the next in its jails) cannot close its rows: the
`training_run` and its rollout collection run stay `running`, its jails go away by
themselves (their pipes close), and the next `epiflow train --algo grpo` on the host marks
the training run `crashed` and its rollout run `interrupted` (the stale-owner rule of
`core.owner`), sweeps its work folder and trains clean, its progress (terminal line and
Prefect artifact) carrying the step's GRPO figures. A real `epiflow` subprocess, real TRL
on the tiny local base model, real nsjail, SQLite, Prefect's test harness."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select
from sqlmodel import col

from collection.request import CollectRequest
from collection.runner import collect_in_process
from models import CollectionRun, Episode, GrpoRollout, TrainingRun, run_id_for
from storage.grpo_rollouts import rollout_run_key
from storage.objects import LocalObjectStore
from tests.cli.local import (
    bare_env,
    cgroups,
    last_line,
    private_cgroup_parent,
    processes_mentioning,
    sandbox_state_dir,
    wait_until,
)

EPIFLOW = str(Path(sys.executable).parent / "epiflow")
ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.slow


def _training_runs(engine: Engine) -> dict[uuid.UUID, tuple[str, str | None]]:
    with engine.connect() as conn:
        rows = conn.execute(
            select(col(TrainingRun.id), col(TrainingRun.status), col(TrainingRun.error))
        ).all()
    return {r[0]: (r[1], r[2]) for r in rows}


def _rollout_run(engine: Engine, training_run: uuid.UUID) -> tuple[str, bool] | None:
    """(status, ended) of the training run's rollout collection run; None before it opens."""
    run_id = run_id_for(rollout_run_key(str(training_run)))
    with engine.connect() as conn:
        row = conn.execute(
            select(col(CollectionRun.status), col(CollectionRun.ended_at)).where(
                col(CollectionRun.id) == run_id
            )
        ).first()
    return None if row is None else (row[0], row[1] is not None)


def _count(engine: Engine, table: type, training_run: uuid.UUID) -> int:
    """Episodes (`Episode`) or `grpo_rollout` rows (`GrpoRollout`) of the rollout run."""
    run_id = run_id_for(rollout_run_key(str(training_run)))
    query = select(func.count()).select_from(Episode).where(col(Episode.run_id) == run_id)
    if table is GrpoRollout:
        query = query.join(GrpoRollout, col(GrpoRollout.episode_id) == col(Episode.id))
    with engine.connect() as conn:
        return int(conn.execute(query).scalar_one())


async def _progress_artifact(key: str) -> str:
    """The description of the newest progress artifact under `key`."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        found = await client.read_artifacts()
    newest = max(
        (a for a in found if a.key == key),
        key=lambda a: a.created.timestamp() if a.created else 0.0,
    )
    return str(newest.description)


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_killed_grpo_training_is_crashed_interrupted_and_leaves_no_jail(
    migrated_engine: Engine, prefect_api_url: str, tmp_path: Path
) -> None:
    with sandbox_state_dir() as state, private_cgroup_parent() as cgroup_parent:
        _scenario(migrated_engine, prefect_api_url, tmp_path, state, cgroup_parent)


def _scenario(
    engine: Engine, prefect_api_url: str, tmp_path: Path, state: Path, cgroup_parent: str
) -> None:
    objects = tmp_path / "objects"
    request = CollectRequest(
        run_key="grpo-src", tasks=2, rollouts=1, concurrency=2, templates=["dir_tree"]
    )
    asyncio.run(collect_in_process(request, engine=engine, store=LocalObjectStore(objects)))
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = bare_env(
        PYTHONPATH=str(ROOT),
        TMPDIR=str(tmp),
        EPIFLOW_HOME=str(tmp_path / "home"),
        EPIFLOW_DATABASE_URL=engine.url.render_as_string(hide_password=False),
        EPIFLOW_OBJECTS_URL=str(objects),
        EPIFLOW_PREFECT_API_URL=prefect_api_url,
        EPIFLOW_SANDBOX_STATE_DIR=str(state),
        EPIFLOW_SANDBOX_CGROUP_PARENT=cgroup_parent,
        EPIFLOW_TRAINING_MAX_STEPS="1000000",  # trains until killed
        EPIFLOW_TRAINING_ROLLOUTS_PER_TASK="2",
        EPIFLOW_TRAINING_BATCH_SIZE="2",
        EPIFLOW_TRAINING_MAX_COMPLETION_LENGTH="16",
        EPIFLOW_TRAINING_PROMPT_STYLE="compact",
        EPIFLOW_AGENT_LOOP_MAX_STEPS="2",
    )
    args = [EPIFLOW, "train", "--algo", "grpo", "--from-run", "grpo-src"]

    log = tmp_path / "killed.log"
    with log.open("wb") as sink:
        victim = subprocess.Popen(args, env=env, stdout=sink, stderr=subprocess.STDOUT)
    try:
        # The event: a first batch of rollouts stored and recorded, and a jail running
        # (the next batch's, or the warm pool's).
        def mid_training() -> bool:
            runs = list(_training_runs(engine))
            return len(runs) == 1 and (
                _count(engine, GrpoRollout, runs[0]) > 0 and bool(processes_mentioning(str(state)))
            )

        reached = wait_until(lambda: mid_training() or victim.poll() is not None, 900)
        assert reached and victim.poll() is None, log.read_text()[-3000:]
    finally:
        victim.send_signal(signal.SIGKILL)
        victim.wait(timeout=60)
    (killed,) = _training_runs(engine)
    assert _training_runs(engine)[killed][0] == "running"  # nothing could close them
    assert _rollout_run(engine, killed) == ("running", False)
    stored = _count(engine, Episode, killed)
    assert stored >= 2

    # The killed trainer's jails notice their closed pipes and go away by themselves.
    assert wait_until(lambda: not processes_mentioning(str(state)), timeout=60), (
        processes_mentioning(str(state))
    )
    assert wait_until(lambda: not cgroups(cgroup_parent), timeout=60), cgroups(cgroup_parent)
    assert list(tmp.glob("epiflow-train-*"))  # its work folder (model copies) stayed

    rerun = subprocess.run(
        [*args, "--max-steps", "1", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "Traceback" not in rerun.stderr, rerun.stderr[-3000:]
    result = json.loads(last_line(rerun.stdout))
    fresh = uuid.UUID(result["training_run_id"])
    assert result["algo"] == "grpo" and result["steps"] == 1

    # Its terminal progress (`training.callbacks.TrainingProgress`, on stderr) and the train
    # flow's progress artifact carry the optimiser step's GRPO figures.
    finished = next(
        (ln for ln in rerun.stderr.splitlines() if "train grpo: finished 1/1 steps" in ln), ""
    )
    for part in (", success ", ", kl ", ", grad_norm ", ", dropped_zero_variance "):
        assert part in finished, rerun.stderr[-3000:]
    shown = asyncio.run(_progress_artifact(f"train-{result['dataset_id']}-progress"))
    assert shown.startswith("step 1 / 1: reward "), shown
    assert "success" in shown and "KL" in shown and "groups dropped" in shown, shown

    runs = _training_runs(engine)
    status, error = runs[killed]
    assert status == "crashed" and error is not None and str(victim.pid) in error
    assert _rollout_run(engine, killed) == ("interrupted", True)
    assert _count(engine, Episode, killed) == stored  # what it stored stays, untouched
    assert runs[fresh] == ("completed", None)
    assert _rollout_run(engine, fresh) == ("completed", True)
    assert _count(engine, GrpoRollout, fresh) == _count(engine, Episode, fresh) == 2
    with engine.connect() as conn:
        running = conn.execute(
            select(func.count())
            .select_from(CollectionRun)
            .where(col(CollectionRun.status) == "running")
        ).scalar_one()
    assert running == 0
    assert not processes_mentioning(str(state))
    assert not cgroups(cgroup_parent)
    assert list(tmp.glob("epiflow-train-*")) == []  # the killed one's swept, its own removed
