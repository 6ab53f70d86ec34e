"""The `collect-shard` flow: one shard of a collection run, on a work pool's worker.

`collect-episodes` with `shards > 1` starts one flow run of this per shard; each plans the
same request, keeps its share of the episodes and writes to the shared database and object
store. The parent marks the run completed and reads the totals from SQL.
"""

from __future__ import annotations

from prefect import flow

from collection.plan import Shard
from collection.request import CollectRequest, CollectResult
from config.settings import load_settings
from flows import route_library_logs
from flows.collect import collect_here


@flow(name="collect-shard", log_prints=False, persist_result=True)
async def collect_shard(
    request: CollectRequest, shard_index: int, shard_count: int
) -> CollectResult:
    """Shard `shard_index` of `shard_count` of `request` (which carries its run key).

    Args:
        request: The collection request, with its run key.
        shard_index: This shard's index (0-based).
        shard_count: Number of shards the run is split into.
    """
    route_library_logs()
    settings = load_settings()
    return await collect_here(
        request, settings, shard=Shard(index=shard_index, count=shard_count), close=False
    )
