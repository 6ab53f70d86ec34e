"""`Collection.run`, the one run sequence: the run row, what remains, the work, the ending
(the one status writer), the totals. Real SQLite; the work is the test's own where the
sequence is under test (no jails needed), the real stream of episodes (real nsjail) where
resuming is."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from collection.lifecycle import Collection, Executed, Work, open_collection
from collection.plan import PlannedEpisode
from collection.request import CollectRequest
from collection.runner import collect
from config.settings import load_settings
from storage import migrate
from storage.db import make_engine
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings

TEMPLATES = ["csv_to_json", "dir_tree"]


@pytest.fixture
def engine(tmp_path: Path) -> Iterator[Engine]:
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'run.db'}"))
    migrate.upgrade(engine)
    yield engine
    engine.dispose()


def _status(engine: Engine, key: str) -> str:
    with engine.connect() as conn:
        return str(
            conn.execute(
                text("SELECT status FROM collection_run WHERE run_key = :k"), {"k": key}
            ).scalar_one()
        )


def _run(engine: Engine, tmp_path: Path, key: str, work: Work) -> tuple[Collection, object]:
    """Open the collection of `key` and run `work` in it: (the collection, the result or
    the error raised)."""
    request = CollectRequest(run_key=key, templates=TEMPLATES)
    store = LocalObjectStore(tmp_path / "objects")

    async def main() -> tuple[Collection, object]:
        async with open_collection(
            request, load_settings(), engine=engine, store=store
        ) as collection:
            try:
                return collection, await collection.run(work)
            except BaseException as e:  # the test inspects what was raised
                return collection, e

    return asyncio.run(main())


def test_a_completed_run_is_ended_once_with_its_totals(engine: Engine, tmp_path: Path) -> None:
    seen: list[int] = []

    async def work(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
        seen.append(len(todo))
        assert _status(engine, "done") == "running"  # the row was written before the work
        return Executed(episodes=0, steps=0)

    collection, result = _run(engine, tmp_path, "done", work)
    assert seen == [2]  # both planned episodes remained
    assert _status(engine, "done") == "completed" and collection.ended == "completed"
    assert getattr(result, "planned", None) == 2


def test_a_failing_work_ends_the_run_failed_and_raises(engine: Engine, tmp_path: Path) -> None:
    async def work(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
        raise RuntimeError("the work broke")

    collection, raised = _run(engine, tmp_path, "broken", work)
    assert isinstance(raised, RuntimeError)
    assert _status(engine, "broken") == "failed" and collection.ended == "failed"


def test_a_cancelled_work_ends_the_run_interrupted(engine: Engine, tmp_path: Path) -> None:
    async def work(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
        raise asyncio.CancelledError

    _, raised = _run(engine, tmp_path, "stopped", work)
    assert isinstance(raised, asyncio.CancelledError)
    assert _status(engine, "stopped") == "interrupted"


def test_an_abandoned_run_stays_interrupted_when_its_work_ends_later(
    engine: Engine, tmp_path: Path
) -> None:
    """The CLI abandons a stop from another thread while the run's work still goes on: the
    first ending recorded stands, the run's own ending does not overwrite it."""

    async def work(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
        abandoning = threading.Thread(target=collection.abandon)
        abandoning.start()
        await asyncio.to_thread(abandoning.join)
        assert _status(engine, "left") == "interrupted"
        return Executed()  # the work then finishes as if nothing happened

    collection, _ = _run(engine, tmp_path, "left", work)
    assert _status(engine, "left") == "interrupted" and collection.ended == "interrupted"


def test_a_rerun_of_the_key_runs_only_what_is_not_stored(engine: Engine, tmp_path: Path) -> None:
    request = CollectRequest(run_key="resumed", templates=TEMPLATES)
    store = LocalObjectStore(tmp_path / "objects")

    async def main() -> list[int]:
        executed = []
        for _ in range(2):
            async with open_collection(
                request, load_settings(), engine=engine, store=store
            ) as collection:
                executed.append((await collect(collection)).executed)
        return executed

    assert asyncio.run(main()) == [2, 0]
    assert _status(engine, "resumed") == "completed"
