"""epiflow's Prefect flows: `collect-episodes`, `collect-shard`, `qc-gate`, `train`, `evaluate`,
`monitor`.

Every flow runs with `log_prints=False`: what libraries print (TRL's metric dicts, dill's
bytecode dumps while `datasets` hashes a dataset, progress bars) stays on the worker's
console and out of the run's log. The run's log gets one INFO line per stage from the
flow itself, plus what epiflow's own module loggers (`logging.getLogger(__name__)` in
`collection`, `scoring`, `training`, …) report — retries, skipped work, stops — through
`route_library_logs`, which also keeps deterministic errors (`orchestration.retries`) to one line.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from storage.objects import ObjectStore

__all__ = ["LIBRARY_LOGGERS", "artifact_key", "link_objects", "route_library_logs"]

LIBRARY_LOGGERS = (
    "agent",
    "collection",
    "expectations",
    "sandbox",
    "scoring",
    "storage",
    "suites",
    "training",
)
"""epiflow packages whose INFO+ records reach the Prefect run's log."""

_routed = False


def artifact_key(prefix: str, name: str) -> str:
    """A Prefect artifact key (lowercase letters, digits, dashes) from `prefix` and `name`:
    every flow keys its artifacts by what it ran on (a run key, a dataset, a checkpoint), so
    running it again adds a version under the same key instead of a new key."""
    return prefix + "-" + "".join(c if c.isalnum() else "-" for c in name.lower())[:60]


async def link_objects(
    store: ObjectStore, key: str, *, artifact: str, text: str, description: str
) -> None:
    """A Prefect link artifact to stored objects (`key`: one object, or a prefix ending in
    `/`), so the UI shows where a run's objects are instead of a key in a log line. A link
    that cannot be published is a WARNING: the objects and their rows are already written."""
    from prefect.artifacts import acreate_link_artifact
    from prefect.logging import get_run_logger

    from storage.objects import object_url

    try:
        await acreate_link_artifact(
            link=object_url(store, key), link_text=text, key=artifact, description=description
        )
    except Exception as e:  # the API is down or refuses it: the objects are stored anyway
        get_run_logger().warning("link artifact %s not published: %r", artifact, e)


def route_library_logs() -> None:
    """Send INFO+ records of epiflow's module loggers to the Prefect run they happen in
    (once per process; records outside a flow or task run are left to the usual handlers)."""
    global _routed
    if _routed:
        return
    from orchestration.retries import quiet_deterministic_tracebacks

    quiet_deterministic_tracebacks()
    from prefect.context import FlowRunContext, TaskRunContext
    from prefect.logging.handlers import APILogHandler

    class RunLogHandler(APILogHandler):
        def emit(self, record: logging.LogRecord) -> None:
            if FlowRunContext.get() is None and TaskRunContext.get() is None:
                return  # a library call outside a run (CLI, tests): not the API's business
            super().emit(record)

    handler = RunLogHandler()
    handler.setLevel(logging.INFO)
    for name in LIBRARY_LOGGERS:
        logger = logging.getLogger(name)
        logger.addHandler(handler)
        if logger.level == logging.NOTSET or logger.level > logging.INFO:
            logger.setLevel(logging.INFO)
    _routed = True
