"""Object store outage mid-run: uploads retry with backoff, episodes that still fail are
recorded as `storage_error` with the reason, no row points at a missing object, and a
re-run of the same run key redoes exactly those episodes."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, select, text
from sqlmodel import col

from agent.trajectory import Trajectory
from collection.request import CollectRequest
from collection.runner import collect_in_process
from models import Artifact, Episode, Step
from storage.objects import make_object_store
from storage.settings import ObjectStoreSettings
from tests.services.s3 import S3Server
from tests.services.tcp_proxy import TcpProxy


@pytest.fixture
def proxied_s3(
    s3_server: S3Server, s3_settings: ObjectStoreSettings
) -> Iterator[tuple[TcpProxy, ObjectStoreSettings]]:
    proxy = TcpProxy(s3_server.port)
    proxy.start()
    yield (
        proxy,
        s3_settings.model_copy(
            update={"endpoint": proxy.endpoint, "retries": 2, "backoff_s": 0.05}
        ),
    )
    proxy.stop()


def _collect(
    engine: Engine, settings: ObjectStoreSettings, request: CollectRequest, after: int, on_cut
) -> None:
    seen = 0

    def count(_: Trajectory) -> None:
        nonlocal seen
        seen += 1
        if seen == after:
            on_cut()

    asyncio.run(
        collect_in_process(
            request,
            engine=engine,
            store=make_object_store(settings),
            on_episode=count,
        )
    )


def test_outage_mid_run(
    migrated_engine: Engine, proxied_s3: tuple[TcpProxy, ObjectStoreSettings]
) -> None:
    proxy, settings = proxied_s3
    request = CollectRequest(
        run_key="outage",
        tasks=3,
        concurrency=1,
        batch_size=3,
        templates=["csv_to_json", "dir_tree", "log_errors"],
    )

    def cut_after_first_batch() -> None:
        # The first batch is written from a worker thread; wait until its rows committed.
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with migrated_engine.connect() as conn:
                if conn.execute(text("SELECT COUNT(*) FROM episode")).scalar_one() >= 3:
                    break
            # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
            time.sleep(0.02)
        proxy.stop()

    _collect(migrated_engine, settings, request, after=4, on_cut=cut_after_first_batch)

    with migrated_engine.connect() as conn:
        rows = conn.execute(
            select(
                col(Episode.id),
                col(Episode.status),
                col(Episode.failure_reason),
                col(Episode.trajectory_key),
            )
        ).all()
        keys = list(conn.execute(select(col(Artifact.key))).scalars())
        keys += [k for k in conn.execute(select(col(Step.stdout_key))).scalars() if k]
    statuses = [r.status for r in rows]
    assert len(rows) == 9
    assert "success" in statuses and "storage_error" in statuses
    for r in rows:
        if r.status == "storage_error":
            assert "after 3 attempts" in r.failure_reason  # 1 try + 2 retries with backoff
            assert r.trajectory_key is None

    proxy.start()  # the outage ends; moto kept every object written before it
    store = make_object_store(settings)
    assert keys and all(store.exists(k) for k in keys)

    _collect(migrated_engine, settings, request, after=-1, on_cut=lambda: None)
    with migrated_engine.connect() as conn:
        final: dict[str, int] = dict(
            conn.execute(text("SELECT status, COUNT(*) FROM episode GROUP BY status")).all()
        )
    assert final == {"success": 9}
