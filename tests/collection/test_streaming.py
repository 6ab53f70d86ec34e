"""`run_episodes` streams the whole plan (real nsjail, SQLite): groups are persisted as
they fill or after the flush interval, `on_persisted` sees each one, and a cancellation
persists every finished episode before it propagates."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
from sqlalchemy import Engine, func, select

from agent.trajectory import Trajectory
from collection.lifecycle import Collection, open_collection, start_run
from collection.request import CollectRequest
from collection.runner import PersistedGroup, run_episodes
from config.settings import load_settings
from models import Episode
from storage import migrate
from storage.db import make_engine
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings

TEMPLATES = ["csv_to_json", "dir_tree", "log_errors"]


@contextmanager
def _open(tmp_path: Path, request: CollectRequest) -> Iterator[tuple[Engine, Collection]]:
    """The request's collection, opened through the lifecycle, its run row started."""
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'stream.db'}"))
    migrate.upgrade(engine)
    store = LocalObjectStore(tmp_path / "objects")
    try:
        with open_collection(request, load_settings(), engine=engine, store=store) as collection:
            start_run(engine, collection.request)  # these tests drive the stream alone
            yield engine, collection
    finally:
        engine.dispose()


def _stored(engine) -> int:
    with engine.connect() as conn:
        return int(conn.execute(select(func.count()).select_from(Episode)).scalar_one())


def test_groups_are_persisted_as_they_fill(tmp_path: Path) -> None:
    request = CollectRequest(
        run_key="stream", tasks=2, rollouts=1, concurrency=3, batch_size=2, templates=TEMPLATES
    )
    with _open(tmp_path, request) as (engine, collection):
        groups: list[tuple[PersistedGroup, int]] = []

        async def on_persisted(group: PersistedGroup) -> None:  # a coroutine hook is awaited
            groups.append((group, _stored(engine)))

        report = asyncio.run(
            run_episodes(collection, collection.remaining(), on_persisted=on_persisted)
        )
        stored = _stored(engine)
        assert len(report.inserted) == 6 == stored
        assert [g.episodes for g, _ in groups] == [2, 2, 2]
        assert sum(g.by_status.get("success", 0) for g, _ in groups) == 6
        # each group was in the database when the hook saw it
        assert [stored for _, stored in groups] == [2, 4, 6]
        assert all(len(g.written.inserted) == g.episodes for g, _ in groups)


def test_the_flush_interval_persists_a_partial_group(tmp_path: Path) -> None:
    request = CollectRequest(
        run_key="stream-tick",
        tasks=1,
        rollouts=2,
        concurrency=1,
        batch_size=100,
        templates=TEMPLATES[:2],
    )
    with _open(tmp_path, request) as (_engine, collection):
        seen: list[int] = []
        asyncio.run(
            run_episodes(
                collection,
                collection.remaining(),
                on_persisted=lambda g: seen.append(g.episodes),
                # Shorter than an episode (a jail round trip per tool call, the verifier):
                # the first episode's group is due before the second one finishes.
                flush_interval_s=0.005,
            )
        )
        # batch_size 100 is never reached: the interval (and the final flush) wrote them
        assert sum(seen) == 4 and len(seen) >= 2
        assert seen[0] < 4  # a partial group went out while episodes were still running


def test_a_slow_write_does_not_hold_up_the_sandboxes(tmp_path: Path) -> None:
    request = CollectRequest(
        run_key="stream-slow-hook",
        tasks=2,
        rollouts=1,
        concurrency=2,
        batch_size=1,
        templates=TEMPLATES,
    )
    with _open(tmp_path, request) as (engine, collection):
        finished: list[Trajectory] = []
        seen_during_first: list[int] = []

        async def on_persisted(group: PersistedGroup) -> None:
            if not seen_during_first:
                # The first group's hook waits for three more episodes to finish: they can
                # only finish if the workers go on while a group is being written.
                deadline = asyncio.get_running_loop().time() + 120
                while len(finished) < 4:
                    assert asyncio.get_running_loop().time() < deadline, "the workers stalled"
                    await asyncio.sleep(0.01)
                seen_during_first.append(len(finished))

        report = asyncio.run(
            run_episodes(
                collection,
                collection.remaining(),
                on_episode=finished.append,
                on_persisted=on_persisted,
            )
        )
        stored = _stored(engine)
        assert seen_during_first and seen_during_first[0] >= 4
        assert len(report.inserted) == 6 == stored


@pytest.mark.slow
def test_cancellation_persists_every_finished_episode(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    request = CollectRequest(
        run_key="stream-cancel",
        tasks=4,
        rollouts=1,
        concurrency=2,
        batch_size=100,
        templates=TEMPLATES,
    )
    with _open(tmp_path, request) as (engine, collection):
        finished: list[Trajectory] = []

        async def main() -> None:
            todo = collection.remaining()
            run = asyncio.create_task(
                run_episodes(collection, todo, on_episode=finished.append, flush_interval_s=60)
            )
            deadline = asyncio.get_running_loop().time() + 300
            while len(finished) < 3 and not run.done():
                assert asyncio.get_running_loop().time() < deadline, "no episode finished"
                await asyncio.sleep(0.05)
            run.cancel()
            with pytest.raises(asyncio.CancelledError):
                await run

        asyncio.run(main())
        stored = _stored(engine)
        assert 3 <= len(finished) < 12
        assert stored == len(finished)
        assert any(
            "stream-cancel cancelled: persisting" in r.getMessage() for r in caplog.records
        )  # nothing finished was lost, nothing half-written
