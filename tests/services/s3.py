"""A real S3 server on loopback: moto's standalone server as a separate process.

MinIO cannot be installed on the development machines; the code speaks S3 only through
the `minio` SDK, so it runs unchanged against MinIO in production.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from tests.services.postgres import free_port

ACCESS_KEY = "epiflow-test"
SECRET_KEY = "epiflow-test-secret"


@dataclass
class S3Server:
    """moto_server on 127.0.0.1; `stop()`/`start()` simulate an outage on the same port."""

    port: int = field(default_factory=free_port)
    process: subprocess.Popen[bytes] | None = None

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        exe = Path(sys.executable).parent / "moto_server"
        env = {**os.environ, "MOTO_ALLOW_NONEXISTENT_REGION": "true"}
        self.process = subprocess.Popen(
            [str(exe), "-H", "127.0.0.1", "-p", str(self.port)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env=env,
        )
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"moto_server exited with {self.process.returncode}")
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=0.5):
                    return
            except OSError:
                # Poll interval of a poll-until (the loop ends on its condition or deadline): not a clock.
                time.sleep(0.1)
        raise RuntimeError("moto_server did not start within 30 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.process = None

    def create_bucket(self) -> str:
        from minio import Minio

        name = f"b-{uuid.uuid4().hex[:12]}"
        Minio(
            self.endpoint, access_key=ACCESS_KEY, secret_key=SECRET_KEY, secure=False
        ).make_bucket(name)
        return name
