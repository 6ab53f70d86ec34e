"""`collect_episodes` as a real Prefect flow (test harness), on real nsjail and storage."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from models import Episode, Step
from storage import migrate
from storage.db import make_engine
from storage.settings import DatabaseSettings


@pytest.fixture
def env_db(db_url: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> str:
    monkeypatch.setenv("EPIFLOW_DATABASE_URL", db_url)
    monkeypatch.setenv("EPIFLOW_OBJECTS_URL", str(tmp_path / "objects"))
    engine = make_engine(DatabaseSettings(url=db_url))
    migrate.upgrade(engine)
    engine.dispose()
    return db_url


def test_collect_flow_runs_resumes_and_publishes(prefect_harness: None, env_db: str) -> None:
    from prefect.client.orchestration import get_client

    from collection.request import CollectRequest
    from flows.collect import collect_episodes

    request = CollectRequest(
        suite="builtin",
        policy="scripted:oracle",
        tasks=1,
        rollouts=2,
        concurrency=4,
        batch_size=1,  # six groups, most within the progress artifact's interval
        run_key="flow-test",
        templates=["csv_to_json", "merge_csv", "log_errors"],
    )
    first = asyncio.run(collect_episodes(request=request))
    assert first.planned == 6 and first.executed == 6 and first.episodes == 6
    assert first.by_status == {"success": 6} and first.success_rate == 1.0

    async def progress() -> tuple[object, str | None]:
        async with get_client() as client:
            found = await client.read_artifacts()
        # This run's (the harness may hold earlier tests' runs of the same key).
        newest = max(
            (a for a in found if a.key == "collect-progress-flow-test"),
            key=lambda a: a.created.timestamp() if a.created else 0.0,
        )
        return newest.data, newest.description

    # Updates are spaced out, but the last group's is never skipped.
    shown, line = asyncio.run(progress())
    assert shown == 100.0 and (line or "").startswith("6 / 6 episodes (success 6)"), line

    again = asyncio.run(collect_episodes(request=request))
    assert again.executed == 0 and again.episodes == 6  # resume: nothing left to do

    engine = make_engine(DatabaseSettings(url=env_db))
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(Episode)).scalar_one() == 6
        steps = conn.execute(select(func.count()).select_from(Step)).scalar_one()
        assert steps == first.steps
        assert (
            conn.execute(
                text("SELECT COUNT(*) FROM collection_run WHERE status = 'completed'")
            ).scalar_one()
            == 1
        )
    engine.dispose()

    async def artifacts() -> dict[str, object]:
        async with get_client() as client:
            found = await client.read_artifacts()
            return {a.key or "": a.data for a in found}

    keys = asyncio.run(artifacts())
    assert "collect-flow-test" in keys and "collect-flow-test-templates" in keys
    # The run's objects as a link artifact (Prefect stores it as a markdown link).
    link = str(keys["collect-flow-test-objects"])
    assert link.startswith("[Stored episodes") and link.endswith("/episodes/flow-test)"), link


def test_flow_refuses_a_run_key_being_collected(prefect_harness: None, env_db: str) -> None:
    """Another process holds the key (here: this test, through the same lock): the flow
    fails at once with `RunKeyBusy` and writes nothing, not even the run row."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterName

    from collection.request import CollectRequest
    from flows.collect import collect_episodes
    from storage.errors import RunKeyBusy
    from storage.run_lock import run_key_lock

    key = f"held-elsewhere-{uuid.uuid4().hex[:6]}"  # the harness outlives this test
    request = CollectRequest(run_key=key, templates=["csv_to_json"])
    with (
        run_key_lock(DatabaseSettings(url=env_db), key),
        pytest.raises(RunKeyBusy, match=key),
    ):
        asyncio.run(collect_episodes(request=request))
    engine = make_engine(DatabaseSettings(url=env_db))
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM collection_run")).scalar_one() == 0
    engine.dispose()

    # Released: the same key runs, and its flow run is named after it.
    done = asyncio.run(collect_episodes(request=request))
    assert done.episodes == done.executed == 1

    async def names() -> list[str]:
        async with get_client() as client:
            runs = await client.read_flow_runs(
                flow_run_filter=FlowRunFilter(name=FlowRunFilterName(any_=[key]))
            )
            return [r.state_name or "" for r in runs]

    assert sorted(asyncio.run(names())) == ["Completed", "Failed"]
