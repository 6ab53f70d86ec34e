"""Point this process at Prefect's API before Prefect is imported.

Prefect reads `PREFECT_API_URL` when it builds its settings (at import). The URL is, in
order: `EPIFLOW_PREFECT_API_URL`; a `PREFECT_API_URL` already in the environment; else
the shared local server (`orchestration.prefect_server`), started on demand and reused by every
epiflow command of this Prefect home. Either way the API must answer before the command
goes on, so a command never fails half-way because Prefect could not start.
"""

from __future__ import annotations

import os

from config.settings import PrefectSettings
from orchestration.prefect_server import API_URL_SETTING, attach, wait_remote


def apply_prefect_settings(settings: PrefectSettings) -> str:
    """Make Prefect's API reachable for this process and return its URL; telemetry off.

    Raises:
        PrefectUnavailable: the API did not answer in time (one line naming the setting).
    """
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    # Heartbeats are how a dead flow run is told from a slow one (`orchestration.automations`);
    # flow runs this process starts, and `serve`'s subprocesses, inherit the period.
    os.environ.setdefault("PREFECT_FLOWS_HEARTBEAT_FREQUENCY", str(settings.heartbeat_s))
    if settings.api_url:
        wait_remote(settings.api_url, min(settings.start_timeout_s, 15.0))
        url = settings.api_url
    elif os.environ.get("PREFECT_API_URL"):
        url = os.environ["PREFECT_API_URL"]
        wait_remote(url, min(settings.start_timeout_s, 15.0), setting="PREFECT_API_URL")
    else:
        url = attach(settings).state.api_url
    os.environ["PREFECT_API_URL"] = url
    return url


__all__ = ["API_URL_SETTING", "apply_prefect_settings"]
