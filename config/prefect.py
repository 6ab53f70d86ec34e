"""Apply epiflow's Prefect settings to the process before Prefect is imported.

Prefect reads `PREFECT_API_URL` when it builds its settings; without it a flow starts
Prefect's ephemeral API (a temporary local server) for the process.
"""

from __future__ import annotations

import os

from config.settings import PrefectSettings


def apply_prefect_settings(settings: PrefectSettings) -> None:
    """Point Prefect at `settings.api_url` when set; keep telemetry off either way."""
    if settings.api_url:
        os.environ["PREFECT_API_URL"] = settings.api_url
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
