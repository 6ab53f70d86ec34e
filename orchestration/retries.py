"""Which failures Prefect retries: a deterministic one ends a flow run once, in one line.

An error whose class is not `retryable` (`core.errors`: an unknown suite, template or
policy, a malformed spec, an invalid setting) fails the same way on every attempt, so:

- a task declared with retries takes `retry_condition_fn=retry_unless_deterministic`,
  and does not run it again;
- a flow with retries (the nightly deployment) wraps its body in `fail_once()`: the flow
  run's remaining retries are dropped before the error leaves the flow, so Prefect's
  server proposes Failed instead of AwaitingRetry (its `RetryFailedFlows` rule reads the
  run's own policy);
- `quiet_deterministic_tracebacks()` (installed with the flows' log routing) drops the
  traceback of such an error from Prefect's task- and flow-run log records: the run's log
  says what to fix in one line each, not forty.

Any other error may be an outage (a database, an object store, an endpoint down) and is
retried where retries are declared.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from core.errors import EpiflowError

PREFECT_RUN_LOGGERS = ("prefect.flow_runs", "prefect.task_runs")
"""Prefect's loggers for what happens in flow and task runs (the run's log)."""


def is_deterministic(error: BaseException | None) -> bool:
    """Whether `error` (or the error it was raised from) is in the input itself."""
    while error is not None:
        if isinstance(error, EpiflowError) and not error.retryable:
            return True
        error = error.__cause__
    return False


def retry_unless_deterministic(task: Any, task_run: Any, state: Any) -> bool:
    """A task's `retry_condition_fn`: retry unless the failure is deterministic."""
    error = state.data if isinstance(state.data, BaseException) else None
    return not is_deterministic(error)


async def drop_remaining_retries() -> None:
    """Set the current flow run's retries to none left (no-op outside a flow run)."""
    from prefect.client.orchestration import get_client
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    if context is None or context.flow_run is None:
        return
    run = context.flow_run
    policy = run.empirical_policy.model_copy(update={"retries": 0})
    async with get_client() as client:
        await client.update_flow_run(run.id, empirical_policy=policy)
    run.empirical_policy = policy


@asynccontextmanager
async def fail_once() -> AsyncIterator[None]:
    """Around a flow's body: a deterministic error ends the flow run Failed on this
    attempt, whatever retries it has."""
    try:
        yield
    except Exception as e:
        if is_deterministic(e):
            from prefect import get_run_logger

            await drop_remaining_retries()
            get_run_logger().error("%s: not retried (fix it, then run again)", _line(e))
        raise


def _line(error: BaseException) -> str:
    return error.user_message() if isinstance(error, EpiflowError) else str(error)


class _DeterministicTracebacks(logging.Filter):
    """Keeps a record whose exception is deterministic, without its traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.exc_info and is_deterministic(record.exc_info[1]):
            record.exc_info = None
            record.exc_text = None
        return True


_FILTER = _DeterministicTracebacks()


def quiet_deterministic_tracebacks() -> None:
    """Drop deterministic errors' tracebacks from the run logs (idempotent)."""
    for name in PREFECT_RUN_LOGGERS:
        logger = logging.getLogger(name)
        if _FILTER not in logger.filters:
            logger.addFilter(_FILTER)
