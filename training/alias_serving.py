"""Serve a model alias's current checkpoint, and follow the alias when it moves
(`epiflow models serve ALIAS`).

The alias is resolved to its checkpoint (`training.aliases`), the checkpoint fetched from
the object store into a scratch directory (`training.registry.fetch_checkpoint`, as an
evaluation does) and served by `transformers serve` on a loopback port of its own
(`agent.serving.serve_checkpoint`). In front of it, on the user's address, a small proxy
(`agent.serving_proxy`) answers for the model name ALIAS: clients keep that URL and name
whatever the alias points at.

Every `poll_s` the alias's current change is read from SQL. When a promotion or a
rollback points it at another checkpoint, that checkpoint is fetched and started beside
the running one; once it answers, the proxy switches to it (new requests go there), the
old backend finishes the requests it was given (at most `drain_s`) and is stopped. A new
checkpoint that fails to start leaves the old one serving (one line says why); a change
to an external endpoint is not served (one line) and the checkpoint keeps serving.

Backends are started in worker threads; stopping (Ctrl-C, SIGTERM: the caller cancels
`serve_alias`) aborts a start still waiting for its server, stops every backend's
process group and removes its scratch directory. Nothing is recorded about the backends:
they live exactly as long as `serve_alias`.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import Engine

from agent.errors import EndpointError
from agent.serving import serve_checkpoint
from agent.serving_proxy import ProxyBackend, SwitchingProxy, listen_socket, run_proxy
from agent.settings import PolicySettings
from core.scratch import scratch_dir
from storage.objects import ObjectStore
from training.aliases import AliasTarget, alias_target
from training.errors import AliasNotServable, AliasServingError, RegistryError

__all__ = ["AliasServeOptions", "servable_target", "serve_alias"]


@dataclass(frozen=True)
class AliasServeOptions:
    """How `serve_alias` serves and watches (the `epiflow models serve` flags)."""

    log_dir: Path
    """Where each backend's `transformers serve` output goes (`<alias>-<checkpoint>.log`)."""
    host: str = "127.0.0.1"
    """The front's address."""
    port: int = 8000
    """The front's port (0: a free one, shown in the first line)."""
    poll_s: float = 5.0
    """Seconds between two reads of the alias."""
    drain_s: float = 120.0
    """Longest wait for an old backend's requests after a switch before it is stopped."""
    startup_timeout_s: float = 600.0
    """Longest wait for a backend to answer its first completion."""
    torch_threads: int | None = None
    """Each backend's torch threads (`OMP_NUM_THREADS`); None: torch's default."""


def servable_target(engine: Engine, alias: str) -> AliasTarget:
    """The alias's current target, when it is a checkpoint.

    Raises:
        AliasNotServable: the alias was never set, or points at an endpoint.
    """
    target = alias_target(engine, alias)
    if target is None:
        raise AliasNotServable(
            f"alias {alias!r} was never set: nothing to serve (epiflow models promote "
            f"{alias} CHECKPOINT --reason …)",
            setting="ALIAS",
        )
    if target.checkpoint_id is None:
        raise AliasNotServable(
            f"alias {alias!r} points at the external endpoint {target.policy}, not a "
            "checkpoint: serve that endpoint itself, or point the alias at a checkpoint",
            setting="ALIAS",
        )
    return target


@dataclass(eq=False)
class _Backend:
    target: AliasTarget
    proxied: ProxyBackend
    stack: contextlib.ExitStack

    @property
    def checkpoint_id(self) -> uuid.UUID | None:
        return self.target.checkpoint_id


class _Backends:
    """The backends this server started, each started in a worker thread; all stopped
    by `close`, those still starting included."""

    def __init__(
        self,
        engine: Engine,
        store: ObjectStore,
        alias: str,
        options: AliasServeOptions,
        policy: PolicySettings,
    ) -> None:
        self._engine, self._store, self._alias = engine, store, alias
        self._options, self._policy = options, policy
        self._abort = threading.Event()
        self._lock = threading.Lock()
        self._stacks: list[contextlib.ExitStack] = []
        self._executor = ThreadPoolExecutor(max_workers=2, thread_name_prefix="alias-backend")

    async def start(self, target: AliasTarget) -> _Backend:
        """Fetch and serve `target`'s checkpoint; returns once it answers.

        Raises:
            RegistryError: the checkpoint cannot be fetched.
            EndpointError: its server did not start (or the server is stopping).
        """
        return await asyncio.wrap_future(self._executor.submit(self._start, target))

    def _start(self, target: AliasTarget) -> _Backend:
        from training.registry import fetch_checkpoint

        checkpoint_id = target.checkpoint_id
        assert checkpoint_id is not None, "servable_target checked it"
        stack = contextlib.ExitStack()
        with self._lock:
            self._stacks.append(stack)
        try:
            work = stack.enter_context(scratch_dir("epiflow-serve-"))
            # The directory's name is the id: the backend answers with `model` set to its
            # path, so every answer names the checkpoint that wrote it.
            model_dir = fetch_checkpoint(
                self._engine, self._store, checkpoint_id, work / str(checkpoint_id)
            )
            served = stack.enter_context(
                serve_checkpoint(
                    model_dir,
                    log_path=self._options.log_dir / f"{self._alias}-{checkpoint_id}.log",
                    policy=self._policy,
                    startup_timeout_s=self._options.startup_timeout_s,
                    torch_threads=self._options.torch_threads,
                    abort=self._abort,
                )
            )
        except BaseException:
            self._close(stack)
            raise
        return _Backend(target, ProxyBackend(served, label=str(checkpoint_id)), stack)

    def _close(self, stack: contextlib.ExitStack) -> None:
        """Stop one backend (its server, then its scratch directory), once."""
        with self._lock:
            if stack not in self._stacks:
                return
            self._stacks.remove(stack)
        stack.close()

    async def stop(self, backend: _Backend) -> None:
        await asyncio.to_thread(self._close, backend.stack)

    async def close(self) -> None:
        """Abort starts in progress, wait for their threads, stop every backend."""
        self._abort.set()
        await asyncio.to_thread(self._executor.shutdown, wait=True)
        for stack in list(self._stacks):
            await asyncio.to_thread(self._close, stack)


async def serve_alias(
    engine: Engine,
    store: ObjectStore,
    alias: str,
    *,
    options: AliasServeOptions,
    policy: PolicySettings,
    announce: Callable[[str], None],
) -> None:
    """Serve `alias` until cancelled (see the module docstring); `announce` gets one line
    when serving starts and one per reload or refused change (`policy`: the entry point's
    policy settings, whose API key a backend's readiness probe sends).

    Raises:
        AliasNotServable: the alias is unset or points at an endpoint (nothing started).
        ServeAddressError: the front cannot listen on `options.host`:`options.port`.
        AliasServingError: the first checkpoint cannot be fetched, or its server did not
            start.
    """
    target = servable_target(engine, alias)
    sock = listen_socket(options.host, options.port)
    backends = _Backends(engine, store, alias, options, policy)
    try:
        try:
            current = await backends.start(target)
        except (RegistryError, EndpointError) as e:
            raise AliasServingError(
                f"alias {alias!r}: checkpoint {target.checkpoint_id} cannot be served: {e}"
            ) from e
        proxy = SwitchingProxy(alias, current.proxied)
        host, port = sock.getsockname()[:2]
        url = f"http://{host}:{port}/v1"
        async with run_proxy(proxy, sock, shutdown_timeout_s=options.drain_s):
            announce(
                f"serving alias {alias!r} (checkpoint {target.checkpoint_id}, change "
                f"{target.seq}) at {url} as model {alias!r}; --policy 'openai:{url}#{alias}'"
            )
            await _follow(engine, alias, current, proxy, backends, options, announce)
    finally:
        sock.close()
        await backends.close()


async def _follow(
    engine: Engine,
    alias: str,
    current: _Backend,
    proxy: SwitchingProxy,
    backends: _Backends,
    options: AliasServeOptions,
    announce: Callable[[str], None],
) -> None:
    """Read the alias every `poll_s` and switch to each new checkpoint it points at."""
    seen = current.target.seq
    retiring: set[asyncio.Task[None]] = set()
    while True:
        await asyncio.sleep(options.poll_s)
        latest = await asyncio.to_thread(alias_target, engine, alias)
        if latest is None or latest.seq == seen:
            continue
        seen = latest.seq
        why = f"{latest.action}, change {latest.seq} by {latest.actor}: {latest.reason}"
        if latest.checkpoint_id is None:
            announce(
                f"alias {alias!r} now points at the endpoint {latest.policy} ({why}); still "
                f"serving checkpoint {current.checkpoint_id}"
            )
            continue
        if latest.checkpoint_id == current.checkpoint_id:
            continue
        try:
            started = await backends.start(latest)
        except (RegistryError, EndpointError) as e:
            announce(
                f"alias {alias!r} -> checkpoint {latest.checkpoint_id} ({why}) not served: "
                f"{e}; still serving checkpoint {current.checkpoint_id}"
            )
            continue
        old, current = current, started
        proxy.switch(current.proxied)
        announce(
            f"alias {alias!r} reloaded: checkpoint {old.checkpoint_id} -> "
            f"{current.checkpoint_id} ({why})"
        )
        task = asyncio.create_task(_retire(old, backends, options, announce))
        retiring.add(task)
        task.add_done_callback(retiring.discard)


async def _retire(
    old: _Backend,
    backends: _Backends,
    options: AliasServeOptions,
    announce: Callable[[str], None],
) -> None:
    """Let the old backend finish its requests (at most `drain_s`), then stop it."""
    drained = await old.proxied.drained(options.drain_s)
    if not drained:
        announce(
            f"checkpoint {old.checkpoint_id}: {old.proxied.in_flight} request(s) still open "
            f"after {options.drain_s:g} s; stopping it (they fail)"
        )
    await backends.stop(old)
    if drained:
        announce(f"checkpoint {old.checkpoint_id} stopped (its open requests were answered)")
