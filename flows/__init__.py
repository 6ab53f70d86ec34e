"""epiflow's Prefect flows: `collect-episodes`, `collect-shard`, `qc-gate`, `train`, `evaluate`.

Every flow runs with `log_prints=False`: what libraries print (TRL's metric dicts, dill's
bytecode dumps while `datasets` hashes a dataset, progress bars) stays on the worker's
console and out of the run's log. The run's log gets one INFO line per stage from the
flow itself, plus what epiflow's own module loggers (`logging.getLogger(__name__)` in
`collection`, `scoring`, `training`, …) report — retries, skipped work, stops — through
`route_library_logs`, which also keeps deterministic errors (`config.retries`) to one line.
"""

from __future__ import annotations

import logging

__all__ = ["LIBRARY_LOGGERS", "artifact_key", "route_library_logs"]

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


def route_library_logs() -> None:
    """Send INFO+ records of epiflow's module loggers to the Prefect run they happen in
    (once per process; records outside a flow or task run are left to the usual handlers)."""
    global _routed
    if _routed:
        return
    from config.retries import quiet_deterministic_tracebacks

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
