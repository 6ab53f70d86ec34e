"""The shared local Prefect server: one per Prefect home, started on demand, reused by every
epiflow command on the machine, gone after an idle period.

Without `EPIFLOW_PREFECT_API_URL`, Prefect would start a temporary API server inside each
process that runs a flow: under load it misses its 20 s start timeout, three at once time
out, a Ctrl-C kills it before the flow can report, and a `kill -9` orphans it. Instead,
every command attaches to one local server, kept in `<PREFECT_HOME>/epiflow-server/`:

    lock           flock: starting, attaching and stopping are serialised
    server.json    pid, process start time, port and API URL of the running server
    server.log     its log
    leases/        one file per attached command process (`<pid>-<start time>`)

Lifecycle. The first command takes the lock, starts `python -m orchestration.prefect_server` in
its own session (so no signal meant for the command reaches it), waits until `/health`
answers, and writes its lease; later commands find it healthy and only write a lease.
A lease is removed when its command exits; one whose process is gone (`kill -9`) counts
as gone too (the start time tells a reused pid apart; `core.owner.process_alive`, the one
process-identity rule). The server checks the leases every
second and stops `local_idle_s` seconds after the last one went away (5 minutes by
default, so consecutive commands and a look at the UI reuse it). `stop` ends it at once.
The server uses the Prefect home's database, so `prefect server start` on the same home
shows the same runs.
"""

from __future__ import annotations

import argparse
import atexit
import contextlib
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from config.settings import ConfigError, PrefectSettings
from core.owner import process_alive, process_start_ticks

SERVER_DIR_NAME = "epiflow-server"
HOST = "127.0.0.1"
START_TIMEOUT_SETTING = "EPIFLOW_PREFECT_START_TIMEOUT_S"
API_URL_SETTING = "EPIFLOW_PREFECT_API_URL"
_POLL_S = 0.25
LEASE_POLL_S = 1.0
"""How often the server checks its leases and its record, in seconds."""


class PrefectUnavailable(ConfigError):
    """Prefect's API did not answer: the shared local server could not start in time, or
    the configured remote API is unreachable. The message names the setting."""


@dataclass(frozen=True)
class ServerState:
    """What `server.json` records about the running local server."""

    pid: int
    """Server process id."""
    start_ticks: int
    """Its start time in clock ticks since boot (tells a reused pid apart)."""
    port: int
    """Loopback port it listens on."""
    started_at: str
    """When it was started (ISO 8601, UTC)."""

    @property
    def api_url(self) -> str:
        return f"http://{HOST}:{self.port}/api"

    @property
    def ui_url(self) -> str:
        return f"http://{HOST}:{self.port}"


@dataclass(frozen=True)
class ServerStatus:
    """The local server as `epiflow prefect status` shows it."""

    directory: str
    """Its directory (`<PREFECT_HOME>/epiflow-server`)."""
    running: bool
    """A live server process is recorded."""
    healthy: bool
    """It answers `/health`."""
    api_url: str | None
    """Its API URL when running."""
    pid: int | None
    """Its process id when running."""
    leases: int
    """Live command processes attached to it."""
    remote: bool = False
    """The status is of the configured Prefect API (`EPIFLOW_PREFECT_API_URL`), not of a
    local server: `running` and `healthy` then both mean it answers `/health`."""


def prefect_home() -> Path:
    """The Prefect home Prefect itself would use (PREFECT_HOME, default ~/.prefect), read
    without importing Prefect."""
    return Path(os.environ.get("PREFECT_HOME") or "~/.prefect").expanduser()


def server_dir(home: Path | None = None) -> Path:
    """Where the shared server of `home` (default: the current Prefect home) keeps its files."""
    return (home or prefect_home()) / SERVER_DIR_NAME


# --- files ---------------------------------------------------------------------------------


@contextlib.contextmanager
def _locked(directory: Path, deadline: float | None) -> Iterator[bool]:
    """Hold the directory's lock; with a `deadline`, yield False instead of waiting past it."""
    directory.mkdir(parents=True, exist_ok=True)
    fd = os.open(directory / "lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if deadline is not None and time.monotonic() >= deadline:
                    yield False
                    return
                time.sleep(_POLL_S)
        try:
            yield True
        finally:
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)


def read_state(directory: Path) -> ServerState | None:
    """The recorded server, or None when none is recorded (or the file is unreadable)."""
    try:
        data = json.loads((directory / "server.json").read_text())
        return ServerState(**data)
    except (OSError, ValueError, TypeError):
        return None


def _write_state(directory: Path, state: ServerState) -> None:
    tmp = directory / f".server.json.{os.getpid()}"
    tmp.write_text(json.dumps(asdict(state)))
    tmp.replace(directory / "server.json")


def _clear_state(directory: Path, state: ServerState) -> None:
    if read_state(directory) == state:
        (directory / "server.json").unlink(missing_ok=True)


def live_leases(directory: Path, *, prune: bool = False) -> list[str]:
    """Names of the leases whose process still runs; with `prune`, delete the others."""
    leases = directory / "leases"
    alive: list[str] = []
    if not leases.is_dir():
        return alive
    for lease in leases.iterdir():
        try:
            pid, ticks = (int(part) for part in lease.name.split("-", 1))
        except ValueError:
            continue
        if process_alive(pid, ticks):
            alive.append(lease.name)
        elif prune:
            lease.unlink(missing_ok=True)
    return alive


def _write_lease(directory: Path) -> Path:
    ticks = process_start_ticks(os.getpid())
    assert ticks is not None
    leases = directory / "leases"
    leases.mkdir(parents=True, exist_ok=True)
    lease = leases / f"{os.getpid()}-{ticks}"
    lease.touch()
    return lease


# --- health --------------------------------------------------------------------------------


def api_healthy(api_url: str, *, timeout_s: float = 5.0) -> str | None:
    """None when `<api_url>/health` answers, else why not (one line). A 401/403 counts as
    an answer: the API is up, and credentials (PREFECT_API_KEY) are Prefect's to check."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=timeout_s) as r:
            return None if r.status == 200 else f"HTTP {r.status}"
    except urllib.error.HTTPError as e:
        e.close()
        return None if e.code in (401, 403) else f"HTTP {e.code}"
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", e)
        return str(reason).splitlines()[0] if str(reason) else type(e).__name__


def wait_remote(api_url: str, timeout_s: float, *, setting: str = API_URL_SETTING) -> None:
    """Wait (at most `timeout_s`) for a remote Prefect API to answer `/health`.

    Raises:
        PrefectUnavailable: it did not; the message names `setting`.
    """
    deadline = time.monotonic() + timeout_s
    while True:
        problem = api_healthy(api_url, timeout_s=max(1.0, min(5.0, timeout_s)))
        if problem is None:
            return
        if time.monotonic() >= deadline:
            raise PrefectUnavailable(
                f"the Prefect API at {api_url} does not answer ({problem}); start it or fix "
                f"{setting}",
                setting=setting,
            )
        time.sleep(0.5)


# --- attaching -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Attached:
    """This process's attachment to the shared local server."""

    state: ServerState
    """The server."""
    lease: Path
    """This process's lease file (removed at exit)."""
    started: bool
    """This process started the server."""


_attached: Attached | None = None


def attach(settings: PrefectSettings, *, directory: Path | None = None) -> Attached:
    """Attach this process to the shared local server, starting it when none runs; the
    lease lasts until the process exits. Idempotent within a process.

    Raises:
        PrefectUnavailable: the server did not answer within `start_timeout_s`, or exited
            while starting (the message names the setting and the log).
    """
    global _attached
    directory = directory or server_dir()
    if _attached is not None and _attached.lease.parent.parent == directory:
        return _attached
    deadline = time.monotonic() + settings.start_timeout_s
    with _locked(directory, deadline) as got:
        if not got:
            raise PrefectUnavailable(
                f"another command held the local Prefect server's lock ({directory / 'lock'}) "
                f"for more than {settings.start_timeout_s:g} s",
                setting=START_TIMEOUT_SETTING,
            )
        lease = _write_lease(directory)
        try:
            state = read_state(directory)
            started = False
            if state is None or not process_alive(state.pid, state.start_ticks):
                port = settings.local_port if _port_free(settings.local_port) else _free_port()
                state = _start(directory, settings, port)
                started = True
            try:
                _wait_healthy(directory, state, deadline, settings)
            except _PortTaken:
                # Another program took the port between the check and the bind: once more.
                state = _start(directory, settings, _free_port())
                _wait_healthy(directory, state, deadline, settings)
        except BaseException:
            lease.unlink(missing_ok=True)
            raise
    atexit.register(lease.unlink, missing_ok=True)
    _attached = Attached(state=state, lease=lease, started=started)
    return _attached


def _port_free(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((HOST, port))
        except OSError:
            return False
    return True


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class _PortTaken(PrefectUnavailable):
    """The server could not bind its port (raised and caught within `attach`)."""


def _start(directory: Path, settings: PrefectSettings, port: int) -> ServerState:
    """Start the server process (detached, in its own session) and record it."""
    env = {k: v for k, v in os.environ.items() if k != "PREFECT_API_URL"}
    env.setdefault("PREFECT_HOME", str(prefect_home()))
    env["PREFECT_SERVER_ANALYTICS_ENABLED"] = "false"
    env["PREFECT_UI_API_URL"] = f"http://{HOST}:{port}/api"
    env.setdefault("PREFECT_SERVER_LOGGING_LEVEL", "WARNING")
    # A fresh log per start: it tells why the last start failed, and never grows unbounded.
    log = (directory / "server.log").open("wb")
    try:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "orchestration.prefect_server",
                "serve",
                "--dir",
                str(directory),
                "--port",
                str(port),
                "--idle-s",
                str(settings.local_idle_s),
            ],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=log,
            env=env,
            cwd=directory,
            start_new_session=True,
        )
    finally:
        log.close()
    # It outlives this process by design (its own watcher ends it); while this process
    # lives, a daemon thread reaps it should it exit first.
    threading.Thread(target=process.wait, name="reap-prefect-server", daemon=True).start()
    ticks = process_start_ticks(process.pid)
    state = ServerState(
        pid=process.pid,
        start_ticks=ticks or 0,
        port=port,
        started_at=datetime.now(UTC).isoformat(timespec="seconds"),
    )
    _write_state(directory, state)
    return state


def _wait_healthy(
    directory: Path, state: ServerState, deadline: float, settings: PrefectSettings
) -> None:
    while True:
        problem = api_healthy(state.api_url, timeout_s=5.0)
        if problem is None:
            return
        if not process_alive(state.pid, state.start_ticks):
            _clear_state(directory, state)
            last = _last_log_line(directory)
            error = _PortTaken if "address already in use" in last.lower() else PrefectUnavailable
            raise error(
                f"the local Prefect server exited while starting: {last} "
                f"(log: {directory / 'server.log'})",
                setting="EPIFLOW_PREFECT_LOCAL_PORT",
            )
        if time.monotonic() >= deadline:
            raise PrefectUnavailable(
                f"the local Prefect server ({state.api_url}, pid {state.pid}) did not answer "
                f"within {settings.start_timeout_s:g} s (log: {directory / 'server.log'}); "
                f"raise {START_TIMEOUT_SETTING} on a loaded machine, or set {API_URL_SETTING}",
                setting=START_TIMEOUT_SETTING,
            )
        time.sleep(_POLL_S)


def _last_log_line(directory: Path) -> str:
    try:
        lines = (directory / "server.log").read_text(errors="replace").strip().splitlines()
    except OSError:
        return "no log"
    return lines[-1].strip()[:300] if lines else "empty log"


# --- status and stop -----------------------------------------------------------------------


def status(directory: Path | None = None) -> ServerStatus:
    """The local server of `directory` (default: the current Prefect home's)."""
    directory = directory or server_dir()
    state = read_state(directory)
    running = state is not None and process_alive(state.pid, state.start_ticks)
    return ServerStatus(
        directory=str(directory),
        running=running,
        healthy=running and state is not None and api_healthy(state.api_url) is None,
        api_url=state.api_url if running and state else None,
        pid=state.pid if running and state else None,
        leases=len(live_leases(directory)),
    )


def remote_status(api_url: str) -> ServerStatus:
    """The configured Prefect API (`EPIFLOW_PREFECT_API_URL`) as `epiflow prefect status`
    shows it: epiflow starts no server then, so "running" is "answers `/health`"."""
    answers = api_healthy(api_url) is None
    return ServerStatus(
        directory=str(server_dir()),
        running=answers,
        healthy=answers,
        api_url=api_url,
        pid=None,
        leases=0,
        remote=True,
    )


def stop(directory: Path | None = None, *, timeout_s: float = 30.0) -> bool:
    """Stop the local server now (SIGTERM, then SIGKILL after `timeout_s`); True when one ran."""
    directory = directory or server_dir()
    with _locked(directory, None):
        state = read_state(directory)
        if state is None or not process_alive(state.pid, state.start_ticks):
            if state is not None:
                _clear_state(directory, state)
            return False
        _clear_state(directory, state)
        _signal_group(state.pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        while process_alive(state.pid, state.start_ticks) and time.monotonic() < deadline:
            time.sleep(0.1)
        if process_alive(state.pid, state.start_ticks):
            _signal_group(state.pid, signal.SIGKILL)
    return True


def _signal_group(pid: int, sig: signal.Signals) -> None:
    # The server leads its own session and process group: signal everything in it.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)


# --- the server process ----------------------------------------------------------------------


def _checks(
    should_exit: threading.Event, poll_s: float, checked: Callable[[], None]
) -> Iterator[None]:
    """One pass every `poll_s` seconds until `should_exit` is set; `checked` is called after
    each pass that did not end the loop."""
    while not should_exit.wait(poll_s):
        yield
        checked()


def _watch(
    directory: Path,
    idle_s: float,
    should_exit: threading.Event,
    server: Any,
    *,
    poll_s: float = LEASE_POLL_S,
    checked: Callable[[], None] = lambda: None,
) -> None:
    """Stop `server` once no live lease has been seen for `idle_s`, or when `server.json`
    no longer names this process (stopped or replaced). Checks every `poll_s` seconds and
    calls `checked` after each check that keeps it running (tests wait on that, not on
    the clock)."""
    me = os.getpid()
    last_seen = time.monotonic()
    recorded = False
    for _ in _checks(should_exit, poll_s, checked):
        state = read_state(directory)
        if state is not None and state.pid == me:
            recorded = True
        elif recorded or (state is not None and process_alive(state.pid, state.start_ticks)):
            # Stopped (`stop` cleared the record) or replaced by another server.
            server.should_exit = True
            return
        if live_leases(directory, prune=True):
            last_seen = time.monotonic()
            continue
        if time.monotonic() - last_seen < idle_s:
            continue
        # Decide under the lock, so that no command attaches between the check and the exit.
        with _locked(directory, time.monotonic() + 1.0) as got:
            if not got or live_leases(directory):
                continue
            if state is not None:
                _clear_state(directory, state)
        server.should_exit = True
        return


def serve(directory: Path, port: int, idle_s: float) -> None:
    """Run the Prefect API and UI on `port` until idle for `idle_s` (the server process)."""
    import uvicorn
    from prefect.server.api.server import create_app

    config = uvicorn.Config(
        create_app(final=True), host=HOST, port=port, log_level="warning", lifespan="on"
    )
    server = uvicorn.Server(config)
    done = threading.Event()
    watcher = threading.Thread(
        target=_watch, args=(directory, idle_s, done, server), name="idle-watch", daemon=True
    )
    watcher.start()
    try:
        server.run()
    finally:
        done.set()
        state = read_state(directory)
        if state is not None and state.pid == os.getpid():
            _clear_state(directory, state)


def main(argv: list[str] | None = None) -> None:
    """`python -m orchestration.prefect_server serve --dir D --port P --idle-s S`."""
    parser = argparse.ArgumentParser(prog="orchestration.prefect_server")
    parser.add_argument("command", choices=["serve"])
    parser.add_argument("--dir", type=Path, required=True)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--idle-s", type=float, required=True)
    args = parser.parse_args(argv)
    serve(args.dir, args.port, args.idle_s)


if __name__ == "__main__":
    main()
