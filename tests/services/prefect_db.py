"""Fresh Prefect homes seeded with a database Prefect has already migrated.

A `prefect server start` on an empty home first runs Prefect's schema migrations. Measured
here (load 3): 25-26 CPU-s to a healthy server on an empty home against 12-13.5 on an empty
home given a migrated database; `prefect server database upgrade` alone is 14 CPU-s. The
suite starts a server on a fresh home a dozen times (each CLI module's local server, each
`PrefectServer`), so each test process migrates once, with Prefect's own command, and
copies the result into each new home. The server still checks the schema at start (and
would migrate a database behind its head), then starts as it would on a user's second day.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

BIN = Path(sys.executable).parent
DB_NAME = "prefect.db"
"""Prefect's default database file in its home (sqlite, `PREFECT_HOME/prefect.db`)."""


@functools.cache
def migrated_prefect_db() -> Path:
    """A Prefect database migrated to head by `prefect server database upgrade`, made once
    per process in a temporary home (removed with the machine's temporary files)."""
    home = Path(tempfile.mkdtemp(prefix="epiflow-prefect-migrated-"))
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PREFECT_API_", "PREFECT_SERVER_DATABASE"))
    }
    env.update(PREFECT_HOME=str(home), PREFECT_SERVER_ANALYTICS_ENABLED="false")
    done = subprocess.run(
        [str(BIN / "prefect"), "server", "database", "upgrade", "-y"],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    if done.returncode != 0 or not (home / DB_NAME).is_file():
        raise RuntimeError(
            f"prefect server database upgrade failed ({done.returncode}): {done.stderr[-2000:]}"
        )
    return home / DB_NAME


def seed_prefect_home(home: Path) -> Path:
    """Give `home` a migrated Prefect database unless it has one already; returns `home`."""
    home.mkdir(parents=True, exist_ok=True)
    target = home / DB_NAME
    if not target.exists():
        shutil.copyfile(migrated_prefect_db(), target)
    return home
