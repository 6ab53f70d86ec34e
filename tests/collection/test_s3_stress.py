"""A collection whose object store sits behind a fault proxy: every third S3 request is met
with `503 SlowDown`, `500 InternalError`, `503 ServiceUnavailable`, an HTML `502`, a
dropped connection, a lost answer or a truncated one. Every episode still ends a success,
every key that SQL points at is in the bucket, and nothing is left orphaned."""

from __future__ import annotations

import asyncio
import logging

import pytest
from sqlalchemy import Engine, select, text
from sqlmodel import col

from collection.request import CollectRequest
from collection.runner import collect_in_process
from models import Artifact, Episode, Step
from storage.objects import make_object_store
from storage.orphans import list_orphans
from storage.settings import ObjectStoreSettings
from tests.services.s3 import S3Server
from tests.services.s3_fault_proxy import FAULTS, S3FaultProxy, every_nth


@pytest.mark.s3
@pytest.mark.slow
def test_collection_through_faulty_s3(
    migrated_engine: Engine,
    s3_server: S3Server,
    s3_settings: ObjectStoreSettings,
    caplog: pytest.LogCaptureFixture,
) -> None:
    proxy = S3FaultProxy(s3_server.port, schedule=every_nth(3, FAULTS))
    proxy.start()
    try:
        # Eight retries: a request that meets a fault on every attempt would need the
        # schedule to line up against it nine times running.
        stressed = make_object_store(
            s3_settings.model_copy(
                update={
                    "endpoint": proxy.endpoint,
                    "retries": 8,
                    "backoff_s": 0.02,
                    "backoff_max_s": 0.2,
                }
            )
        )
        caplog.set_level(logging.WARNING, logger="storage.objects")
        request = CollectRequest(
            run_key="s3-stress",
            tasks=2,
            rollouts=2,
            concurrency=4,
            batch_size=4,
            templates=["csv_to_json", "dir_tree", "log_errors", "jsonl_extract"],
        )
        assert request.templates is not None
        planned = len(request.templates) * request.tasks * request.rollouts
        asyncio.run(collect_in_process(request, engine=migrated_engine, store=stressed))

        with migrated_engine.connect() as conn:
            statuses: dict[str, int] = dict(
                conn.execute(text("SELECT status, COUNT(*) FROM episode GROUP BY status")).all()
            )
            keys = set(conn.execute(select(col(Artifact.key))).scalars())
            pointed = set(conn.execute(select(col(Episode.trajectory_key))).scalars())
            pointed |= {k for k in conn.execute(select(col(Step.stdout_key))).scalars() if k}
            pointed |= {k for k in conn.execute(select(col(Step.stderr_key))).scalars() if k}
        assert statuses == {"success": planned}, statuses
        assert pointed <= keys

        # Checked straight against the S3 server, past the proxy.
        direct = make_object_store(s3_settings)
        assert keys and all(direct.exists(k) for k in keys)
        assert list_orphans(migrated_engine, direct).keys == []
        # The stressed store reads back what it wrote.
        assert all(stressed.exists(k) for k in sorted(keys)[:6])
    finally:
        proxy.stop()

    assert all(proxy.counts[kind] >= 1 for kind in FAULTS), proxy.counts
    retries = [r.getMessage() for r in caplog.records if r.name == "storage.objects"]
    # Each fault failed one attempt, and each failed attempt was logged before its retry.
    assert len(retries) == sum(proxy.counts[kind] for kind in FAULTS), retries
