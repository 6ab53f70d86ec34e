"""Serve a checkpoint directory over HTTP with `transformers serve`, for the `openai:` policy.

    with serve_checkpoint(model_dir, log_path=work / "serve.log") as served:
        policy_spec = served.policy_spec          # openai:http://127.0.0.1:<port>/v1#<dir>

A real OpenAI-compatible server (`/v1/chat/completions` with `usage`), started on a free
loopback port with the model pinned (`FORCE_MODEL`: requests must name the directory,
which `policy_spec` does) and continuous batching on, so concurrent episodes are batched
instead of served one at a time. Startup waits for the port to listen, then for one
1-token completion within the deadline (a CPU server's first one can take minutes); the
server's output goes to a log file; the process group is stopped (SIGTERM, then SIGKILL)
on every exit from the block, so no server outlives its user.

Continuous batching gets a KV cache sized for the job (`CACHE_TOKENS`),
not transformers' default of 60% of a CPU machine's RAM. An operator serves the same
directory by hand: `transformers serve <dir> --host 127.0.0.1 --port 8000
--continuous-batching --cb-num-blocks 128`, then
`--policy 'openai:http://127.0.0.1:8000/v1#<dir>'`.

On a shared CPU give the server one thread (`torch_threads=1`, by hand
`OMP_NUM_THREADS=1 transformers serve …`): with the other core busy, torch's two threads
wait for each other at every op. SmolLM2 answering 4 concurrent compact-prompt requests of
64 tokens took 123 s on two threads and 14.6 s on one (load 4–5).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from agent.errors import EndpointError
from agent.policies.openai_compat import probe_endpoint
from agent.settings import PolicySettings

__all__ = ["CACHE_TOKENS", "ServedModel", "serve_checkpoint", "serve_command"]


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


CACHE_TOKENS = 32_768
"""Tokens the continuous-batching KV cache holds (every layer): 8 concurrent episodes of
4,096 tokens. Left to itself, transformers sizes the cache from the device's memory — on a
CPU 60% of the machine's RAM: 14 GB for the 135 M SmolLM2 on a 23 GB machine, and every
decoding step's attention mask spans the whole cache. Sized for the job it is ~1.5 GB for
SmolLM2 (fp32: 46 KiB a token) and the masks shrink with it."""
CACHE_PAGE_TOKENS = 256
"""Tokens per KV-cache block (`transformers serve`'s default page size)."""


def serve_command(
    model_dir: Path,
    *,
    port: int,
    continuous_batching: bool = True,
    cache_tokens: int = CACHE_TOKENS,
    max_batch_tokens: int | None = None,
) -> list[str]:
    """The `transformers serve` command line for `model_dir` on 127.0.0.1:`port`; with
    continuous batching, its KV cache sized for `cache_tokens` and its passes for
    `max_batch_tokens` (None: transformers' default; see `CACHE_TOKENS`)."""
    cli = Path(sys.executable).with_name("transformers")
    command = [str(cli), "serve", str(model_dir), "--host", "127.0.0.1", "--port", str(port)]
    if continuous_batching:
        blocks = max(1, -(-cache_tokens // CACHE_PAGE_TOKENS))
        command += ["--continuous-batching", "--cb-num-blocks", str(blocks)]
        if max_batch_tokens is not None:
            command += ["--cb-max-batch-tokens", str(max_batch_tokens)]
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
    policy: PolicySettings,
    startup_timeout_s: float = 600.0,
    continuous_batching: bool = True,
    cache_tokens: int = CACHE_TOKENS,
    max_batch_tokens: int | None = None,
    torch_threads: int | None = None,
    abort: threading.Event | None = None,
) -> Iterator[ServedModel]:
    """Start `transformers serve` for `model_dir`, wait until it answers, yield it, stop it
    (`policy`: the entry point's policy settings, whose API key the readiness probe sends;
    `cache_tokens`, `max_batch_tokens`: the continuous-batching sizes, `serve_command`;
    `torch_threads`: the server's intra-op threads, `OMP_NUM_THREADS`; None: torch's
    default, every core; `abort`: set from another thread, it ends the wait for readiness
    within a second and stops the server: how a caller that starts servers in a thread
    stops one that is still loading).

    Raises:
        EndpointError: the server exited, did not answer a 1-token completion within
            `startup_timeout_s` (the message names the log file and its last lines), or
            `abort` was set before it answered.
    """
    model_dir = model_dir.resolve()
    port = _free_port()
    base_url = f"http://127.0.0.1:{port}/v1"
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            serve_command(
                model_dir,
                port=port,
                continuous_batching=continuous_batching,
                cache_tokens=cache_tokens,
                max_batch_tokens=max_batch_tokens,
            ),
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=_server_env(torch_threads),
            start_new_session=True,  # its own process group: stopped as one
        )
    try:
        _wait_ready(process, base_url, str(model_dir), log_path, startup_timeout_s, policy, abort)
        yield ServedModel(
            base_url=base_url, model=str(model_dir), log_path=log_path, pid=process.pid
        )
    finally:
        _stop(process)


def _server_env(torch_threads: int | None) -> dict[str, str]:
    env = dict(os.environ)
    if torch_threads is not None:
        env["OMP_NUM_THREADS"] = str(torch_threads)
    return env


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1.0):
            return True
    except OSError:
        return False


def _wait_ready(
    process: subprocess.Popen[bytes],
    base_url: str,
    model: str,
    log_path: Path,
    timeout_s: float,
    policy: PolicySettings,
    abort: threading.Event | None = None,
) -> None:
    """Wait until the port listens (polled), then for one 1-token completion with the
    rest of the deadline: the first completion of a continuous-batching server on a CPU
    can take minutes (its cache and warm-up), and abandoned probes would queue behind it.
    `abort`, once set, ends either wait with an `EndpointError`."""
    deadline = time.monotonic() + timeout_s
    port = int(base_url.rsplit(":", 1)[1].split("/", 1)[0])

    def exited() -> EndpointError:
        return EndpointError(
            f"transformers serve exited with code {process.returncode} before answering "
            f"(log {log_path}: {_log_tail(log_path)})",
            endpoint=base_url,
        )

    def aborted() -> EndpointError:
        return EndpointError(
            f"transformers serve for {model} was stopped before it answered", endpoint=base_url
        )

    while not _listening(port):
        if abort is not None and abort.is_set():
            raise aborted()
        if process.poll() is not None:
            raise exited()
        if time.monotonic() >= deadline:
            raise EndpointError(
                f"transformers serve for {model} did not listen within {timeout_s:g} s "
                f"(log {log_path}: {_log_tail(log_path)})",
                endpoint=base_url,
            )
        time.sleep(0.5)
    left = max(1.0, deadline - time.monotonic())
    try:
        answered = asyncio.run(_probe_unless_aborted(base_url, model, policy, left, abort))
    except EndpointError as e:
        if process.poll() is not None:
            raise exited() from e
        raise EndpointError(
            f"transformers serve for {model} did not answer within {timeout_s:g} s "
            f"({e}; log {log_path}: {_log_tail(log_path)})",
            endpoint=base_url,
        ) from e
    if not answered:
        raise aborted()


async def _probe_unless_aborted(
    base_url: str,
    model: str,
    policy: PolicySettings,
    deadline_s: float,
    abort: threading.Event | None,
) -> bool:
    """The readiness probe; False when `abort` was set first (the probe is cancelled)."""
    probe = asyncio.ensure_future(probe_endpoint(base_url, model, policy, deadline_s=deadline_s))
    while abort is not None and not probe.done():
        await asyncio.wait({probe}, timeout=0.5)
        if abort.is_set() and not probe.done():
            probe.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await probe
            return False
    await probe
    return True
