"""The `collect-shard` flow: one shard of a collection run, on a work pool's worker.

`collect-episodes` with `shards > 1` starts one flow run of this per shard; each plans the
same request, keeps its share of the episodes and writes to the shared database and object
store, holding its shard's lock while its collection is open. The parent marks the run completed and reads
the totals from SQL; the shard's own result is not persisted (it would stay on this
worker's disk).
"""

from __future__ import annotations

from typing import Any

from prefect import flow
from prefect.context import FlowRunContext

from collection.lifecycle import open_collection
from collection.plan import Shard
from collection.request import CollectRequest, CollectResult
from config.settings import load_settings
from flows import route_library_logs
from flows.collect import collect_here, plan_task
from storage.run_lock import shard_lock_name


def _shard_run_name() -> str:
    """`<run key>#shard-<i>-of-<n>`: the shard's lock name, readable in the UI."""
    context = FlowRunContext.get()
    parameters: dict[str, Any] = dict(context.parameters or {}) if context is not None else {}
    raw = parameters.get("request")
    if raw is None:
        return "collect-shard"
    request = raw if isinstance(raw, CollectRequest) else CollectRequest.model_validate(raw)
    return shard_lock_name(
        str(request.run_key),
        int(parameters.get("shard_index", 0)),
        int(parameters.get("shard_count", 1)),
    )


@flow(
    name="collect-shard",
    flow_run_name=_shard_run_name,
    log_prints=False,
    persist_result=False,
)
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
    shard = Shard(index=shard_index, count=shard_count)
    async with open_collection(request, settings, shard=shard, planner=plan_task) as collection:
        return await collect_here(collection)
