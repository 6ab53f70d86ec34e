"""A real `prefect server start` on loopback, in its own PREFECT_HOME, as a subprocess."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.services.postgres import free_port
from tests.services.prefect_db import seed_prefect_home

BIN = Path(sys.executable).parent


@dataclass
class PrefectServer:
    port: int = field(default_factory=free_port)
    home: Path = field(
        default_factory=lambda: Path(tempfile.mkdtemp(prefix="epiflow-prefect-server-"))
    )
    process: subprocess.Popen[bytes] | None = None

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/api"

    def env(self, **extra: str) -> dict[str, str]:
        base = {k: v for k, v in os.environ.items() if not k.startswith(("PREFECT_", "EPIFLOW_"))}
        base.update(
            PREFECT_HOME=str(self.home),
            PREFECT_API_URL=self.api_url,
            PREFECT_SERVER_ANALYTICS_ENABLED="false",
            PREFECT_LOGGING_LEVEL="INFO",
            # Default local paths of the subprocess land here, never in ~/.epiflow.
            EPIFLOW_HOME=str(self.home / "epiflow-home"),
        )
        base.update(extra)
        return base

    def start(self, timeout: float = 120) -> None:
        seed_prefect_home(self.home)  # a migrated database: the start skips Prefect's migrations
        env = self.env(PREFECT_UI_API_URL=self.api_url)
        env.pop("PREFECT_API_URL")
        self.process = subprocess.Popen(
            [
                str(BIN / "prefect"),
                "server",
                "start",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
            ],
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"prefect server exited with {self.process.returncode}")
            try:
                with urllib.request.urlopen(f"{self.api_url}/health", timeout=2) as response:
                    if response.status == 200:
                        return
            except OSError:
                # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
                time.sleep(0.5)
        raise RuntimeError("prefect server did not become healthy")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            os.killpg(self.process.pid, 15)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, 9)
                self.process.wait()
        self.process = None

    def prefect(self, *args: str, cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(BIN / "prefect"), *args],
            env=self.env(**env),
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=180,
        )
