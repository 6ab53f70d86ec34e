"""One running jail: the nsjail process, its executor, and the framed pipe between them.

Transport only: `request` sends one JSON frame and waits for the answer; executor death
(EOF on its stdout) or silence past the deadline becomes `SandboxCrashed`, never a hang.
`kill` ends the jail and everything in it: EOF on the executor's stdin first (it kills
its PID namespace and exits), then SIGKILL to nsjail and to the jail's init.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import time
from collections import deque
from pathlib import Path
from typing import Any, cast

from sandbox.errors import SandboxCrashed, SandboxUnavailable

#: Largest frame the host accepts from the executor (bounded by the caps it enforces).
MAX_FRAME = 512 << 20
_STDERR_TAIL = 16384
_EXIT_GRACE_S = 2.0


class _JailProtocol(asyncio.SubprocessProtocol):
    """Splits the executor's stdout into frames; keeps the tail of nsjail's stderr."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._buffer = bytearray()
        self.frames: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.stdout_eof = False
        self.protocol_error: str | None = None
        self.stderr_tail = bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def pipe_data_received(self, fd: int, data: bytes) -> None:
        if fd == 2:
            self.stderr_tail += data
            del self.stderr_tail[:-_STDERR_TAIL]
            return
        self._buffer += data
        while len(self._buffer) >= 4:
            size = int.from_bytes(self._buffer[:4], "big")
            if size > MAX_FRAME:
                self.protocol_error = f"executor sent a {size}-byte frame (limit {MAX_FRAME})"
                self._buffer.clear()
                break
            if len(self._buffer) < 4 + size:
                break
            self.frames.append(bytes(self._buffer[4 : 4 + size]))
            del self._buffer[: 4 + size]
        self._wake()

    def pipe_connection_lost(self, fd: int, exc: Exception | None) -> None:
        if fd == 1:
            self.stdout_eof = True
            self._wake()

    def process_exited(self) -> None:
        if not self.exited.done():
            self.exited.set_result(None)
        self.stdout_eof = True
        self._wake()


class Jail:
    """A started jail whose executor answered the handshake."""

    def __init__(
        self,
        transport: asyncio.SubprocessTransport,
        protocol: _JailProtocol,
        argv: list[str],
        cgroup_parents: tuple[Path, ...] = (),
    ) -> None:
        self._transport = transport
        self._protocol = protocol
        self.argv = argv
        self._cgroup_parents = cgroup_parents
        self.nsjail_pid: int = transport.get_pid()
        self.executor_pid: int | None = None
        """Host pid of the jail's init (the executor), for leak checks and the last-resort kill."""
        self.started_at = time.monotonic()
        self.handshake: dict[str, Any] = {}
        self._busy = False
        self._killed = False

    @classmethod
    async def start(
        cls, argv: list[str], *, start_timeout_s: float, cgroup_parents: tuple[Path, ...] = ()
    ) -> Jail:
        """Start nsjail with `argv` and wait for the executor's ready frame.

        `cgroup_parents` are where nsjail makes this jail's cgroups (`NSJAIL.<init pid>`);
        they are removed here if nsjail itself has to be killed before it could. A start
        that is cancelled kills what it started.

        Raises:
            SandboxUnavailable: nsjail failed to start the jail or the executor never answered.
        """
        loop = asyncio.get_running_loop()
        try:
            transport, protocol = await loop.subprocess_exec(
                lambda: _JailProtocol(loop),
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE,
                start_new_session=True,
            )
        except OSError as e:
            raise SandboxUnavailable(f"cannot run nsjail {argv[0]}: {e}") from e
        jail = cls(transport, protocol, argv, cgroup_parents)
        try:
            jail.handshake = await jail._next_frame(start_timeout_s)
        except SandboxCrashed as e:
            await jail.kill()
            raise SandboxUnavailable(f"jail did not start: {e}") from e
        except BaseException:  # cancelled while starting (Ctrl-C): leave no jail or cgroup
            await asyncio.shield(jail.kill())
            raise
        if not jail.handshake.get("ready"):
            await jail.kill()
            raise SandboxUnavailable(f"executor sent no ready frame: {jail.handshake!r}")
        jail.executor_pid = _first_child(jail.nsjail_pid)
        return jail

    @property
    def alive(self) -> bool:
        """True until the executor or nsjail went away or the jail was killed."""
        return not (self._killed or self._protocol.stdout_eof)

    @property
    def stderr_tail(self) -> str:
        """The last bytes nsjail (and the executor) wrote to stderr, for error messages."""
        return self._protocol.stderr_tail.decode("utf-8", errors="replace").strip()

    async def _next_frame(self, timeout_s: float) -> dict[str, Any]:
        protocol = self._protocol
        deadline = time.monotonic() + timeout_s
        while not protocol.frames:
            if protocol.protocol_error:
                raise SandboxCrashed(protocol.protocol_error)
            if protocol.stdout_eof or self._killed:
                raise SandboxCrashed(
                    f"the jail's executor exited; nsjail said: {self.stderr_tail or '(nothing)'}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxCrashed(f"the jail's executor did not answer within {timeout_s:.1f} s")
            protocol.waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(protocol.waiter, remaining)
            except TimeoutError:
                continue
            finally:
                protocol.waiter = None
        raw = protocol.frames.popleft()
        try:
            frame = json.loads(raw)
        except ValueError as e:
            raise SandboxCrashed(f"executor sent a malformed frame: {raw[:200]!r}") from e
        if not isinstance(frame, dict):
            raise SandboxCrashed(f"executor sent a non-object frame: {raw[:200]!r}")
        return cast(dict[str, Any], frame)

    async def request(self, payload: dict[str, Any], *, timeout_s: float) -> dict[str, Any]:
        """Send one request and return the executor's answer.

        Raises:
            SandboxCrashed: the executor died, sent garbage, or stayed silent past `timeout_s`
                (the jail is killed in the last two cases).
        """
        if self._busy:
            raise RuntimeError("a jail serves one request at a time")
        if not self.alive:
            raise SandboxCrashed(
                f"the jail is gone; nsjail said: {self.stderr_tail or '(nothing)'}"
            )
        self._busy = True
        try:
            body = json.dumps(payload, separators=(",", ":")).encode("ascii")
            stdin = cast(asyncio.WriteTransport, self._transport.get_pipe_transport(0))
            stdin.write(len(body).to_bytes(4, "big") + body)
            answer = await self._next_frame(timeout_s)
        except SandboxCrashed:
            await self.kill()
            raise
        finally:
            self._busy = False
        if "error" in answer:
            await self.kill()
            raise SandboxCrashed(f"executor failed: {answer['error']}")
        return answer

    async def kill(self) -> None:
        """End the jail and everything in it; idempotent."""
        # A busy executor is not reading its stdin: it would not notice EOF before its
        # command ends, so it is killed at once.
        busy = self._busy
        self._killed = True
        transport = self._transport
        if transport.is_closing() and self._protocol.exited.done():
            return
        stdin = transport.get_pipe_transport(0)
        if stdin is not None:
            stdin.close()  # EOF: an idle executor kills its PID namespace and exits
        if not busy:
            await self._wait_exit(_EXIT_GRACE_S)
        if not self._protocol.exited.done() and self.executor_pid is not None:
            # SIGKILL to the jail's init takes its whole PID namespace with it. nsjail is
            # still alive here, so the pid cannot have been reused yet; nsjail then reaps it
            # and exits (killing nsjail first would leave init a zombie of the host's init).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.executor_pid, signal.SIGKILL)
            await self._wait_exit(_EXIT_GRACE_S)
        if not self._protocol.exited.done():
            with contextlib.suppress(ProcessLookupError):
                transport.kill()
            await self._protocol.exited
            self._remove_cgroups()
        transport.close()

    def _remove_cgroups(self) -> None:
        if self.executor_pid is None:
            return
        for parent in self._cgroup_parents:
            # Only an empty cgroup can be removed; a busy one stays (and is reported).
            with contextlib.suppress(FileNotFoundError):
                (parent / f"NSJAIL.{self.executor_pid}").rmdir()

    async def _wait_exit(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self._protocol.exited), timeout_s)


def _first_child(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
    except OSError:
        return None
    return int(children[0]) if children else None
