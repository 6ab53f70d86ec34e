"""Headless Chromium for page checks (DOM dumps and screenshots), when it is installed.

Flags as the machine notes require: no sandbox (root), no background networking (the
network is closed), a fresh profile per run.
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile
from collections.abc import Sequence

import pytest


def require_chromium(what: str) -> str:
    """The Chromium binary, or skip the test saying what was not checked."""
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.skip(f"Chromium is not installed (apt-get install chromium): {what} was not checked")
    return found


def run_chromium(
    chromium: str, *args: str, budget_ms: int = 20000
) -> subprocess.CompletedProcess[str]:
    """Run headless Chromium with `args` (e.g. `--dump-dom URL`, `--screenshot=PATH URL`)."""
    profile = tempfile.mkdtemp(prefix="epiflow-chromium-")
    try:
        done = subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-quic",
                "--no-first-run",
                "--disable-background-networking",
                "--disable-component-update",
                "--disable-sync",
                f"--user-data-dir={profile}",
                "--window-size=1400,900",  # a later --window-size wins
                f"--virtual-time-budget={budget_ms}",
                *args,
            ],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    finally:
        shutil.rmtree(profile, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-2000:]
    return done


def live_page_dom(
    chromium: str,
    url: str,
    *,
    showing: Sequence[str],
    attempts: int = 4,
    budget_ms: int = 30000,
) -> str:
    """The DOM of a page a live server renders from its API (the Prefect UI), dumped again
    until it holds every string of `showing` or `attempts` dumps were made; the last dump
    is returned and the caller asserts on it.

    `--virtual-time-budget` advances the page's clock faster than a loaded server answers
    its API calls, so one dump can be taken before the data arrived (CI saw the runs page
    without 'night-1' at load ~3 on 2 cores while the same test passed alone). What the
    page must show is asserted by the caller; only when it shows it is left to load.
    """
    dom = ""
    for _ in range(attempts):
        dom = run_chromium(chromium, "--dump-dom", url, budget_ms=budget_ms).stdout
        if all(s in dom for s in showing):
            break
    return dom
