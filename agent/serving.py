"""Serve a checkpoint directory over HTTP with `transformers serve`, for the `openai:` policy.

    with serve_checkpoint(model_dir, log_path=work / "serve.log") as served:
        policy_spec = served.policy_spec          # openai:http://127.0.0.1:<port>/v1#<dir>

A real OpenAI-compatible server (`/v1/chat/completions` with `usage`), started on a free
loopback port with the model pinned (`FORCE_MODEL`: requests must name the directory,
which `policy_spec` does) and continuous batching on, so concurrent episodes are batched
instead of served one at a time. Startup waits for `GET /health` and a 1-token completion
within a deadline; the server's output goes to a log file; the process group is stopped
(SIGTERM, then SIGKILL) on every exit from the block, so no server outlives its user.

An operator serves the same directory by hand: `transformers serve <dir> --host 127.0.0.1
--port 8000 --continuous-batching`, then `--policy 'openai:http://127.0.0.1:8000/v1#<dir>'`.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.errors import EndpointError
from agent.policies.openai_compat import probe_endpoint
from agent.settings import PolicySettings

__all__ = ["ServedModel", "serve_checkpoint", "serve_command"]


@dataclass(frozen=True)
class ServedModel:
    """A running server and how to reach it."""

    base_url: str
    """`http://127.0.0.1:<port>/v1`."""
    model: str
    """The model name requests must carry (the served directory)."""
    log_path: Path
    """Where the server's stdout and stderr go."""
    pid: int
    """The server's process id (leader of its own process group)."""

    @property
    def policy_spec(self) -> str:
        """The `openai:` spec of this server."""
        return f"openai:{self.base_url}#{self.model}"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def serve_command(model_dir: Path, *, port: int, continuous_batching: bool = True) -> list[str]:
    """The `transformers serve` command line for `model_dir` on 127.0.0.1:`port`."""
    cli = Path(sys.executable).with_name("transformers")
    command = [str(cli), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    if continuous_batching:
        command.append("--continuous-batching")
    return [*command, "--log-level", "info"]


def _stop(process: subprocess.Popen[bytes], grace_s: float = 10.0) -> None:
    if process.poll() is not None:
        return
    try:
        os.killpg(process.pid, signal.SIGTERM)
        process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)
        process.wait(timeout=grace_s)
    except ProcessLookupError:
        return


def _log_tail(path: Path, lines: int = 3) -> str:
    try:
        text = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return " | ".join(text[-lines:])[:400]


@contextmanager
def serve_checkpoint(
    model_dir: Path,
    *,
    log_path: Path,
    startup_timeout_s: float = 300.0,
    continuous_batching: bool = True,
) -> Iterator[ServedModel]:
    """Start `transformers serve` for `model_dir`, wait until it answers, yield it, stop it.

    Raises:
        EndpointError: the server exited or did not answer a 1-token completion within
            `startup_timeout_s` (the message names the log file and its last lines).
    """
    model_dir = model_dir.resolve()
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            serve_command(model_dir, port=port, continuous_batching=continuous_batching),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # its own process group: stopped as one
        )
    try:
        _wait_ready(process, base_url, str(model_dir), log_path, startup_timeout_s)
        yield ServedModel(
            base_url=base_url, model=str(model_dir), log_path=log_path, pid=process.pid
        )
    finally:
        _stop(process)


def _wait_ready(
    process: subprocess.Popen[bytes],
    base_url: str,
    model: str,
    log_path: Path,
    timeout_s: float,
) -> None:
    deadline = time.monotonic() + timeout_s
    settings = PolicySettings()
    last: EndpointError | None = None
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise EndpointError(
                f"transformers serve exited with code {process.returncode} before answering "
                f"(log {log_path}: {_log_tail(log_path)})",
                endpoint=base_url,
            )
        try:
            left = max(1.0, deadline - time.monotonic())
            asyncio.run(probe_endpoint(base_url, model, settings, deadline_s=min(left, 60.0)))
            return
        except EndpointError as e:
            last = e
            time.sleep(1.0)
    raise EndpointError(
        f"transformers serve for {model} did not answer within {timeout_s:g} s "
        f"({last}; log {log_path}: {_log_tail(log_path)})",
        endpoint=base_url,
    )
