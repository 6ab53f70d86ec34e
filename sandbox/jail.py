"""One running jail: the nsjail process, its executor, and the framed pipe between them.

Transport only: `request` sends one JSON frame and waits for the answer; executor death
(EOF on its stdout) or silence past the deadline becomes `SandboxCrashed`, never a hang.
`kill` ends the jail and everything in it: EOF on the executor's stdin first (it kills
its PID namespace and exits), then SIGKILL to the jail's init and, last, to nsjail.

nsjail is started with a plain `subprocess.Popen` and watched through the event loop's
own readers (its pipes and a pidfd), not through asyncio's subprocess machinery: that
one starts a watcher thread per child and hops between threads at start and exit,
which costs milliseconds per jail on a loaded machine (see docs/sandbox.md).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import subprocess
import time
import weakref
from collections import deque
from pathlib import Path
from typing import Any, cast

from sandbox.errors import SandboxCrashed, SandboxUnavailable

#: Largest frame the host accepts from the executor (bounded by the caps it enforces).
MAX_FRAME = 512 << 20
_STDERR_TAIL = 16384
_EXIT_GRACE_S = 2.0
_READ_CHUNK = 1 << 20


class _Channel:
    """The host side of one jail's pipes: frames from stdout, the tail of stderr, exit."""

    def __init__(self, loop: asyncio.AbstractEventLoop, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
        self._loop = loop
        self._proc = proc
        self.stdin_fd: int | None = proc.stdin.fileno()
        self.stdout_fd: int | None = proc.stdout.fileno()
        self.stderr_fd: int | None = proc.stderr.fileno()
        self.pidfd: int | None = os.pidfd_open(proc.pid)
        self._buffer = bytearray()
        self._pending_out = bytearray()
        self.frames: deque[bytes] = deque()
        self.waiter: asyncio.Future[None] | None = None
        self.stdout_eof = False
        self.protocol_error: str | None = None
        self.stderr_tail = bytearray()
        self.exited: asyncio.Future[None] = loop.create_future()
        self.close_on_exit = False
        """Set by a kill that was cancelled before the exit came: close the pipes then."""
        for fd in (self.stdin_fd, self.stdout_fd, self.stderr_fd):
            os.set_blocking(fd, False)
        loop.add_reader(self.stdout_fd, self._on_stdout)
        loop.add_reader(self.stderr_fd, self._on_stderr)
        loop.add_reader(self.pidfd, self._on_exit)

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def _on_stdout(self) -> None:
        assert self.stdout_fd is not None
        try:
            data = os.read(self.stdout_fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self.stdout_fd)
            self.stdout_eof = True
            self._wake()
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

    def _on_stderr(self) -> None:
        assert self.stderr_fd is not None
        try:
            data = os.read(self.stderr_fd, _READ_CHUNK)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._loop.remove_reader(self.stderr_fd)
            return
        self.stderr_tail += data
        del self.stderr_tail[:-_STDERR_TAIL]

    def _on_exit(self) -> None:
        assert self.pidfd is not None
        self._loop.remove_reader(self.pidfd)
        os.close(self.pidfd)
        self.pidfd = None
        self._proc.poll()  # reaps nsjail
        # Whatever the executor wrote before it went is still in the pipe: read it first.
        if self.stdout_fd is not None and not self.stdout_eof:
            self._on_stdout()
        self.stdout_eof = True
        if not self.exited.done():
            self.exited.set_result(None)
        self._wake()
        if self.close_on_exit:
            self.close()

    def send(self, data: bytes) -> None:
        """Queue `data` for the executor's stdin (written as the pipe drains)."""
        if self.stdin_fd is None:
            return  # closed: the request will see EOF or the deadline
        if self._pending_out:
            self._pending_out += data
            return
        self._pending_out += data
        self._on_writable()
        if self._pending_out and self.stdin_fd is not None:
            self._loop.add_writer(self.stdin_fd, self._on_writable)

    def _on_writable(self) -> None:
        assert self.stdin_fd is not None
        while self._pending_out:
            try:
                written = os.write(self.stdin_fd, self._pending_out[:_READ_CHUNK])
            except BlockingIOError:
                return
            except OSError:  # EPIPE: the executor is gone; its stdout says so
                self._pending_out.clear()
                break
            del self._pending_out[:written]
        self._loop.remove_writer(self.stdin_fd)

    def close_stdin(self) -> None:
        """EOF for the executor (an idle one kills its PID namespace and exits)."""
        if self.stdin_fd is not None:
            self._loop.remove_writer(self.stdin_fd)
            self._pending_out.clear()
            self.stdin_fd = None
            assert self._proc.stdin is not None
            self._proc.stdin.close()

    def close(self) -> None:
        """Stop watching and close every pipe (after the process exited)."""
        self.close_stdin()
        for attr in ("stdout_fd", "stderr_fd", "pidfd"):
            fd = getattr(self, attr)
            if fd is not None:
                self._loop.remove_reader(fd)
                if attr == "pidfd":
                    os.close(fd)
                setattr(self, attr, None)
        assert self._proc.stdout is not None and self._proc.stderr is not None
        self._proc.stdout.close()
        self._proc.stderr.close()


def _abandon(proc: subprocess.Popen[bytes]) -> None:
    """Last resort when a Jail is garbage-collected unclosed: EOF ends the executor, and
    the host's ends of its pipes are closed."""
    for pipe in (proc.stdin, proc.stdout, proc.stderr):
        if pipe is not None:
            with contextlib.suppress(OSError):
                pipe.close()


class Jail:
    """A started jail whose executor answered the handshake."""

    def __init__(
        self,
        proc: subprocess.Popen[bytes],
        channel: _Channel,
        argv: list[str],
        cgroup_parents: tuple[Path, ...] = (),
    ) -> None:
        self._proc = proc
        self._channel = channel
        self.argv = argv
        self._cgroup_parents = cgroup_parents
        self.nsjail_pid: int = proc.pid
        self.executor_pid: int | None = None
        """Host pid of the jail's init (the executor), for leak checks and the last-resort kill."""
        self.started_at = time.monotonic()
        self.handshake: dict[str, Any] = {}
        self._busy = False
        self._killed = False
        weakref.finalize(self, _abandon, proc)

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
            # Blocks only until nsjail is exec'd (vfork: well under a millisecond); the rest
            # of the start is watched through the loop.
            proc = subprocess.Popen(  # noqa: ASYNC220
                argv,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                bufsize=0,
            )
        except OSError as e:
            raise SandboxUnavailable(f"cannot run nsjail {argv[0]}: {e}") from e
        try:
            channel = _Channel(loop, proc)
        except OSError as e:  # pidfd_open: the kernel is too old for it
            proc.kill()
            proc.wait()
            raise SandboxUnavailable(f"cannot watch nsjail (pidfd_open): {e}") from e
        jail = cls(proc, channel, argv, cgroup_parents)
        try:
            jail.handshake = await jail._next_frame(start_timeout_s)
        except SandboxCrashed as e:
            await jail.kill()
            raise SandboxUnavailable(f"jail did not start: {e}") from e
        except BaseException:
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
        return not (self._killed or self._channel.stdout_eof)

    @property
    def stderr_tail(self) -> str:
        """The last bytes nsjail (and the executor) wrote to stderr, for error messages."""
        return self._channel.stderr_tail.decode("utf-8", errors="replace").strip()

    async def _next_frame(self, timeout_s: float) -> dict[str, Any]:
        channel = self._channel
        deadline = time.monotonic() + timeout_s
        while not channel.frames:
            if channel.protocol_error:
                raise SandboxCrashed(channel.protocol_error)
            if channel.stdout_eof or self._killed:
                raise SandboxCrashed(
                    f"the jail's executor exited; nsjail said: {self.stderr_tail or '(nothing)'}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise SandboxCrashed(f"the jail's executor did not answer within {timeout_s:.1f} s")
            channel.waiter = asyncio.get_running_loop().create_future()
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for returns the result of
            # a future that completed as the caller was cancelled, and the cancellation is
            # lost (a Ctrl-C that also kills the jail would be swallowed here).
            try:
                async with asyncio.timeout(remaining):
                    await channel.waiter
            except TimeoutError:
                continue
            finally:
                channel.waiter = None
        raw = channel.frames.popleft()
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
            self._channel.send(len(body).to_bytes(4, "big") + body)
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
        """End the jail and everything in it; idempotent. Cancelled before the jail has
        gone, it SIGKILLs what is left and its pipes close when the exit comes."""
        try:
            await self._kill()
        except asyncio.CancelledError:
            channel = self._channel
            if channel.exited.done():
                channel.close()
            else:
                channel.close_on_exit = True
                with contextlib.suppress(ProcessLookupError):
                    if self.executor_pid is not None:
                        os.kill(self.executor_pid, signal.SIGKILL)
                    else:
                        self._proc.kill()
            raise

    async def _kill(self) -> None:
        # A busy executor is not reading its stdin: it would not notice EOF before its
        # command ends, so it is killed at once.
        busy = self._busy
        self._killed = True
        channel = self._channel
        if channel.exited.done():
            channel.close()
            return
        channel.close_stdin()
        if not busy:
            await self._wait_exit(_EXIT_GRACE_S)
        if not channel.exited.done() and self.executor_pid is not None:
            # SIGKILL to the jail's init takes its whole PID namespace with it. nsjail is
            # still alive here, so the pid cannot have been reused yet; nsjail then reaps it
            # and exits (killing nsjail first would leave init a zombie of the host's init).
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.executor_pid, signal.SIGKILL)
            await self._wait_exit(_EXIT_GRACE_S)
        if not channel.exited.done():
            with contextlib.suppress(ProcessLookupError):
                self._proc.kill()
            await asyncio.shield(channel.exited)
            self._remove_cgroups()
        channel.close()

    def _remove_cgroups(self) -> None:
        if self.executor_pid is None:
            return
        for parent in self._cgroup_parents:
            # Only an empty cgroup can be removed; a busy one stays (and is reported).
            with contextlib.suppress(FileNotFoundError):
                (parent / f"NSJAIL.{self.executor_pid}").rmdir()

    async def _wait_exit(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout_s):
                await asyncio.shield(self._channel.exited)


def _first_child(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            children = f.read().split()
    except OSError:
        return None
    return int(children[0]) if children else None
