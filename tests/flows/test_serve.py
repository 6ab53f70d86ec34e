"""`epiflow serve` against a real `prefect server`: the deployments and the nightly
schedule exist through Prefect's API; a headless Chromium screenshot of the deployments
page when Chromium is installed."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.services.chromium import live_page_dom, run_chromium
from tests.services.prefect_server import PrefectServer

EXPECTED = {
    "nightly-collect", "nightly-champion", "qc-gate", "train", "evaluate", "shard", "monitor",
}  # fmt: skip


@pytest.fixture(scope="module")
def served(
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[tuple[PrefectServer, dict[str, dict[str, object]]]]:
    """A real Prefect server with `epiflow serve` running against it; yields the deployments."""
    tmp_path = tmp_path_factory.mktemp("serve")
    server = PrefectServer()
    server.start()
    env = server.env(
        EPIFLOW_PREFECT_API_URL=server.api_url,
        EPIFLOW_DATABASE_URL=f"sqlite:///{tmp_path / 'serve.db'}",
        EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"),
    )
    serving = subprocess.Popen(
        [str(Path(sys.executable).parent / "epiflow"), "serve"],
        env=env,
        cwd=tmp_path,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 120
        found: dict[str, dict[str, object]] = {}
        while time.monotonic() < deadline and not set(found) >= EXPECTED:
            assert serving.poll() is None, "epiflow serve exited"
            deployments = _post(f"{server.api_url}/deployments/filter", {})
            assert isinstance(deployments, list)
            found = {str(d["name"]): d for d in deployments}
            # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
            time.sleep(1)
        yield server, found
    finally:
        os.killpg(serving.pid, signal.SIGTERM)
        try:
            serving.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(serving.pid, signal.SIGKILL)
            serving.wait()
        server.stop()


def _post(url: str, body: dict[str, object]) -> object:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=10) as response:
        return json.loads(response.read())


def test_serve_registers_deployments_with_the_nightly_schedule(
    served: tuple[PrefectServer, dict[str, dict[str, object]]],
) -> None:
    _, found = served
    assert set(found) >= EXPECTED
    nightly = found["nightly-collect"]
    schedules = nightly["schedules"]
    assert isinstance(schedules, list) and len(schedules) == 1
    schedule = schedules[0]["schedule"]
    assert schedule["cron"] == "0 2 * * *" and schedule["timezone"] == "UTC"
    assert schedules[0]["active"] is True
    parameters = nightly["parameters"]
    assert isinstance(parameters, dict) and parameters["gate"] is True
    # The production monitor: run from the UI on demand, the champion by default.
    monitor = found["monitor"]
    assert monitor["schedules"] == [] and monitor["parameters"] == {
        "alias": "champion",
        "rollback": False,
    }


def test_deployments_page_screenshot(
    served: tuple[PrefectServer, dict[str, dict[str, object]]], tmp_path: Path
) -> None:
    server, _ = served
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        pytest.skip(
            "Chromium is not installed: the deployments page screenshot was not taken (apt-get install chromium)"
        )
    target = Path(os.environ.get("EPIFLOW_SCREENSHOT_DIR", tmp_path)) / "prefect-deployments.png"
    page = f"http://127.0.0.1:{server.port}/deployments"
    dom = live_page_dom(chromium, page, showing=list(EXPECTED))
    for name in EXPECTED:
        assert name in dom, f"{name} not on the deployments page"
    run_chromium(chromium, f"--screenshot={target}", page)
    assert target.exists() and target.stat().st_size > 10_000
