"""A small client of a real Prefect server's REST API for the tests that drive workers,
`serve` and automations from outside: every call is retried until a deadline when the
loaded server answers 5xx or drops the connection, and waits poll with deadlines."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import httpx

T = TypeVar("T")


@dataclass
class Api:
    url: str
    client: httpx.Client = field(default_factory=lambda: httpx.Client(timeout=30))

    def call(self, method: str, path: str, body: Any = None) -> Any:
        deadline = time.monotonic() + 180
        while True:
            try:
                response = self.client.request(method, self.url + path, json=body)
                if response.status_code < 500:
                    response.raise_for_status()
                    return response.json() if response.content else None
                problem = f"HTTP {response.status_code}: {response.text[:200]}"
            except httpx.TransportError as e:
                problem = repr(e)
            assert time.monotonic() < deadline, f"{method} {path}: {problem}"
            # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
            time.sleep(1)

    def post(self, path: str, body: Any) -> Any:
        return self.call("POST", path, body)

    def get(self, path: str) -> Any:
        return self.call("GET", path)

    def patch(self, path: str, body: Any) -> Any:
        return self.call("PATCH", path, body)

    def flow_run(self, flow_run_id: str) -> dict[str, Any]:
        return dict(self.get(f"/flow_runs/{flow_run_id}"))

    def states(self, flow_run_id: str) -> list[str]:
        """The flow run's state names, oldest first."""
        found = self.get(f"/flow_run_states/?flow_run_id={flow_run_id}")
        return [s["name"] for s in sorted(found, key=lambda s: s["timestamp"])]

    def deployment(self, flow_name: str, name: str) -> dict[str, Any]:
        return dict(self.get(f"/deployments/name/{flow_name}/{name}"))

    def automation_trail(self) -> str:
        """What the automations did lately, and the flow runs' Crashed/Cancelled/… events
        (for a failure message)."""
        found = self.post(
            "/events/filter",
            {
                "filter": {"event": {"prefix": ["prefect.automation.", "prefect.flow-run.C"]}},
                "limit": 30,
            },
        )
        return "; ".join(
            f"{e['event']} {e['resource'].get('prefect.resource.name')} "
            f"{json.dumps(e.get('payload'))[:300]}"
            for e in found["events"]
        )


def wait_for(
    what: str | Callable[[], str],
    probe: Callable[[], T | None],
    timeout: float,
    every: float = 1.0,
) -> T:
    """Poll `probe` until it returns something other than None/False, or fail naming `what`
    (a callable is asked only then, e.g. for the state of things at the deadline)."""
    deadline = time.monotonic() + timeout
    while True:
        found = probe()
        if found is not None and found is not False:
            return found
        if time.monotonic() >= deadline:
            label = what() if callable(what) else what
            raise AssertionError(f"timed out after {timeout:g} s waiting for {label}")
        # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
        time.sleep(every)
