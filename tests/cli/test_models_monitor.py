"""`epiflow models monitor` as a user runs it (a subprocess, the Prefect test harness's
server, SQLite): a trace file whose tool failures are worse than the champion's baseline
prints one line per check and the breach, rolls the alias back with `--rollback`, and
exits 1; a healthy file exits 0 and changes nothing; no window is bad input, exit 2."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent.atif_convert import to_atif
from agent.trajectory import Trajectory
from storage.objects import LocalObjectStore
from tests.cli.local import EPIFLOW
from tests.training.factory import call_step, episode, final_step
from tests.training.test_aliases import _checkpoint
from training.aliases import alias_target, point_alias
from training.registry import record_evaluation

ROOT = Path(__file__).resolve().parents[2]


def _file(path: Path, episodes: list[Trajectory]) -> Path:
    path.write_text("".join(json.dumps(to_atif(t)) + "\n" for t in episodes), encoding="utf-8")
    return path


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_models_monitor_prints_each_check_and_exits_by_verdict(
    migrated_engine: Engine, prefect_api_url: str, tmp_path: Path
) -> None:
    objects = tmp_path / "objects"
    store = LocalObjectStore(objects)
    store.check()
    previous, champion = _checkpoint(migrated_engine, store), _checkpoint(migrated_engine, store)
    point_alias(migrated_engine, store, "champion", previous, reason="first", actor="t")
    point_alias(migrated_engine, store, "champion", champion, reason="promoted", actor="t")
    record_evaluation(migrated_engine, champion, {"tool_failure_rate": 0.0, "completion_rate": 1.0})
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(
        PYTHONPATH=str(ROOT),
        EPIFLOW_HOME=str(tmp_path / "home"),
        EPIFLOW_DATABASE_URL=migrated_engine.url.render_as_string(hide_password=False),
        EPIFLOW_OBJECTS_URL=str(objects),
        EPIFLOW_PREFECT_API_URL=prefect_api_url,
        COLUMNS="200",  # typer's usage-error box keeps the message on one line
    )

    def monitor(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [EPIFLOW, "models", "monitor", "champion", *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )

    healthy = _file(tmp_path / "healthy.jsonl", [episode(task=i) for i in range(5)])
    done = monitor("--from", str(healthy), "--rollback")
    assert done.returncode == 0, done.stderr[-2000:]
    assert "ok logic.tool_failure_rate: 0.000, rule <= 0.100 (baseline 0.000)" in done.stdout
    assert "verdict within the rule on 5 episodes" in done.stdout

    failing = [
        episode(
            task=i,
            success=False,
            steps=[call_step(0, "cat nope", output="", exit_code=1), final_step(1)],
        )
        for i in range(5)
    ]
    done = monitor("--from", str(_file(tmp_path / "bad.jsonl", failing)), "--rollback")
    assert done.returncode == 1, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert "BREACH logic.tool_failure_rate: 1.000, rule <= 0.100 (baseline 0.000)" in lines
    assert "skipped efficiency.avg_steps: the champion's evaluation has no avg_steps" in lines
    assert lines[-1] == f"rolled back: champion -> hf:checkpoint/{previous}"
    back = alias_target(migrated_engine, "champion")
    assert back is not None and back.checkpoint_id == previous and back.action == "rollback"

    done = monitor()
    assert done.returncode == 2
    assert "give exactly one of --from FILE and --run KEY" in done.stderr
