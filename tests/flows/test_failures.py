"""Deterministic failures end a flow run once (`orchestration.retries`), through Prefect's real test
harness: a request with an unknown template fails on its first attempt although the flow
has retries; a failure that may be an outage (a deployment that does not answer) is
retried. The attempts are counted on the flow run (`run_count`, its state history), never
timed. Real SQLite; the episodes never start."""

from __future__ import annotations

import asyncio
import logging
import sys
from typing import Any

import pytest
from sqlalchemy import Engine

from collection.errors import CollectError, RequestError
from core.errors import EpiflowError
from orchestration.retries import is_deterministic, quiet_deterministic_tracebacks
from storage.objects import LocalObjectStore
from tests.services.prefect_api import wait_for


def _history(flow_run_id: Any) -> tuple[Any, list[str]]:
    from prefect.client.orchestration import get_client

    async def read() -> tuple[Any, list[str]]:
        async with get_client() as client:
            run = await client.read_flow_run(flow_run_id)
            states = await client.read_flow_run_states(flow_run_id)
            return run, [s.name or "" for s in sorted(states, key=lambda s: s.timestamp)]

    return asyncio.run(read())


def _log_messages(flow_run_id: Any) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    async def read() -> list[str]:
        async with get_client() as client:
            found = await client.read_logs(
                LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id]))
            )
            return [log.message for log in found]

    return asyncio.run(read())


def _nightly(request: dict[str, Any], **parameters: Any) -> Any:
    """A run of the nightly flow (two retries), with no delay between attempts."""
    from collection.request import CollectRequest
    from flows.collect import nightly_collect_episodes

    flow = nightly_collect_episodes.with_options(retry_delay_seconds=0)
    assert flow.retries == 2

    async def run() -> Any:
        return await flow(
            request=CollectRequest.model_validate(request), return_state=True, **parameters
        )

    return asyncio.run(run())


def test_an_unknown_template_fails_once(
    prefect_harness: None, gated_env: tuple[Engine, LocalObjectStore]
) -> None:
    state = _nightly({"suite": "builtin", "templates": ["no_such_template"], "run_key": "bad"})
    assert state.is_failed()
    run, history = _history(state.state_details.flow_run_id)
    assert run.run_count == 1, history
    assert "AwaitingRetry" not in history and "Retrying" not in history
    assert "no_such_template" in (state.message or "")
    with pytest.raises(RequestError):
        state.result()


def test_a_failure_that_may_pass_is_retried(
    prefect_harness: None, gated_env: tuple[Engine, LocalObjectStore]
) -> None:
    state = _nightly(
        {"suite": "builtin", "templates": ["csv_to_json"], "run_key": "shards-gone"},
        shards=2,
        shard_deployment="collect-shard/no-such-deployment",
    )
    assert state.is_failed()
    run, history = _history(state.state_details.flow_run_id)
    assert run.run_count == 3, history  # the first attempt and both retries
    assert history.count("AwaitingRetry") == 2
    # The harness has no automations: the parent says a lost worker's shard would hang it.
    warned = wait_for(
        "the crash-detection warning in the run's logs",
        lambda: [m for m in _log_messages(run.id) if "epiflow prefect setup" in m] or None,
        60,
    )
    assert "not set up" in warned[0] and "shard whose worker is lost" in warned[0], warned


def test_deterministic_means_the_input() -> None:
    assert is_deterministic(RequestError("--suite 'x': unknown suite"))
    assert not is_deterministic(CollectError("2 of 2 shards did not complete"))
    assert not is_deterministic(EpiflowError("the database did not answer"))
    try:
        try:
            raise RequestError("--policy: unknown scheme")
        except RequestError as e:
            raise RuntimeError("wrapped") from e
    except RuntimeError as wrapped:
        assert is_deterministic(wrapped)  # raised from one


def test_run_logs_keep_one_line_of_a_deterministic_error() -> None:
    quiet_deterministic_tracebacks()
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    # The filter Prefect's run loggers now carry, on a logger of this test's own (Prefect's
    # API handler refuses records outside a run).
    [installed] = [
        f
        for f in logging.getLogger("prefect.task_runs").filters
        if f in logging.getLogger("prefect.flow_runs").filters
    ]
    logger = logging.getLogger("epiflow-test-run-log")
    logger.propagate = False
    logger.addFilter(installed)
    handler = Keep()
    logger.addHandler(handler)
    try:
        for error in (RequestError("--templates: unknown template 'x'"), OSError("disk")):
            try:
                raise error
            except Exception as e:
                logger.error("Task run failed with exception: %r", e, exc_info=True)
    finally:
        logger.removeHandler(handler)
        logger.removeFilter(installed)
    deterministic, other = records[-2:]
    assert deterministic.exc_info is None and "unknown template" in deterministic.getMessage()
    assert other.exc_info is not None and other.exc_info[0] is OSError  # kept: may be an outage
    assert sys.exc_info() == (None, None, None)
