"""A stable OpenAI-compatible front whose backend can be switched while it serves.

    proxy = SwitchingProxy("champion", ProxyBackend(served, label=str(checkpoint_id)))
    async with run_proxy(proxy, listen_socket("127.0.0.1", 8000)):
        old = proxy.switch(ProxyBackend(new_served, label=...))   # new requests go there
        await old.drained(timeout_s=120)                           # the old ones finish

The front (Starlette, served by uvicorn, forwarding with httpx) owns the user's address;
each backend is a `transformers serve` on its own loopback port (`agent.serving`). A
client sends the front's model name (`model`); the front rewrites it to the backend's
(the served directory) and relays the answer as it comes, streamed or not, untouched,
with the header `X-Epiflow-Backend` naming the backend (its `label`). `GET /v1/models`
is the front's own: one model, the front's name, with the backend's label.

A switch is an assignment: requests that arrive after it go to the new backend; those
already forwarded finish on the old one, which counts them (`ProxyBackend.in_flight`) so
its owner stops it only once they are done (`drained`). Clients keep the URL and the
model name; they see a new `X-Epiflow-Backend` and a new `model` in the answers.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from agent.errors import ServeAddressError
from agent.serving import ServedModel

__all__ = ["BACKEND_HEADER", "ProxyBackend", "SwitchingProxy", "listen_socket", "run_proxy"]

BACKEND_HEADER = "X-Epiflow-Backend"
"""Response header naming the backend that answered (its `ProxyBackend.label`)."""

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "host",
    }
)
"""Headers that describe one connection, not the message: never forwarded."""


@dataclass(eq=False)
class ProxyBackend:
    """One backend server and the requests it is answering now."""

    served: ServedModel
    label: str
    """What it serves, for people and the `X-Epiflow-Backend` header (a checkpoint id)."""
    in_flight: int = 0
    """Requests forwarded to it whose answer is not yet relayed in full."""
    _idle: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def __post_init__(self) -> None:
        self._idle.set()

    def acquire(self) -> None:
        self.in_flight += 1
        self._idle.clear()

    def release(self) -> None:
        self.in_flight -= 1
        if self.in_flight == 0:
            self._idle.set()

    async def drained(self, timeout_s: float) -> bool:
        """Wait until no request is in flight on it; False when `timeout_s` passed first."""
        try:
            async with asyncio.timeout(timeout_s):
                await self._idle.wait()
        except TimeoutError:
            return False
        return True


def _error(status: int, message: str, code: str) -> Response:
    """An OpenAI-style error body."""
    return JSONResponse(
        {"error": {"message": message, "type": "invalid_request_error", "code": code}},
        status_code=status,
    )


class SwitchingProxy:
    """The front: one model name, forwarded to the current backend."""

    def __init__(self, model: str, backend: ProxyBackend) -> None:
        self.model = model
        """The model name clients send (and `/v1/models` lists)."""
        self.current = backend
        """The backend new requests go to."""
        self._client: httpx.AsyncClient | None = None

    def switch(self, backend: ProxyBackend) -> ProxyBackend:
        """Send new requests to `backend` from now on; returns the previous one (still
        answering what it was given: see `ProxyBackend.drained`)."""
        previous, self.current = self.current, backend
        return previous

    def app(self) -> Starlette:
        """The ASGI app: `GET /v1/models`, and every other `/v1/…` request forwarded."""
        methods = ["GET", "POST", "PUT", "PATCH", "DELETE"]

        @contextlib.asynccontextmanager
        async def lifespan(_app: Starlette) -> AsyncIterator[None]:
            # No read timeout: a long generation is the backend's to bound, and a client
            # that gives up closes its connection (which closes the upstream one).
            timeout = httpx.Timeout(connect=10.0, read=None, write=60.0, pool=None)
            async with httpx.AsyncClient(timeout=timeout) as client:
                self._client = client
                yield
            self._client = None

        return Starlette(
            routes=[
                Route("/v1/models", self._models, methods=["GET"]),
                Route("/v1/{path:path}", self._forward, methods=methods),
            ],
            lifespan=lifespan,
        )

    async def _models(self, _request: Request) -> Response:
        backend = self.current
        entry = {
            "id": self.model,
            "object": "model",
            "created": int(time.time()),
            "owned_by": "epiflow",
            "backend": backend.label,
        }
        return JSONResponse(
            {"object": "list", "data": [entry]}, headers={BACKEND_HEADER: backend.label}
        )

    async def _forward(self, request: Request) -> Response:
        assert self._client is not None, "the proxy app runs inside its lifespan"
        body = await request.body()
        backend = self.current  # read once: a switch during this request does not move it
        payload = _json_object(body)
        if payload is not None and "model" in payload:
            if payload["model"] != self.model:
                return _error(
                    404,
                    f"model {payload['model']!r} is not served here: send model {self.model!r}",
                    "model_not_found",
                )
            body = json.dumps({**payload, "model": backend.served.model}).encode()
        headers = {
            k: v
            for k, v in request.headers.items()
            if k.lower() not in HOP_BY_HOP and k.lower() != "content-length"
        }
        url = backend.served.base_url.removesuffix("/v1") + request.url.path
        if request.url.query:
            url += f"?{request.url.query}"
        upstream_request = self._client.build_request(
            request.method, url, headers=headers, content=body
        )
        backend.acquire()
        try:
            upstream = await self._client.send(upstream_request, stream=True)
        except httpx.TransportError as e:
            backend.release()
            return _error(
                502, f"the backend of {self.model!r} ({backend.label}) failed: {e}", "bad_gateway"
            )
        except BaseException:
            backend.release()
            raise
        return _Relay(upstream, backend)


def _json_object(body: bytes) -> dict[str, Any] | None:
    if not body:
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


class _Relay(StreamingResponse):
    """The backend's answer relayed as it arrives (status, headers and bytes untouched,
    plus `X-Epiflow-Backend`); the backend's request count is released however the relay
    ends: sent, client gone, or an error."""

    def __init__(self, upstream: httpx.Response, backend: ProxyBackend) -> None:
        headers = {k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP}
        headers[BACKEND_HEADER] = backend.label
        super().__init__(upstream.aiter_raw(), status_code=upstream.status_code, headers=headers)
        self._upstream = upstream
        self._backend = backend

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            await self._upstream.aclose()
            self._backend.release()


def listen_socket(host: str, port: int) -> socket.socket:
    """A socket bound to `host`:`port` and listening (port 0: a free one), before anything
    slow starts, so a taken port is reported at once.

    Raises:
        ServeAddressError: the port is taken, or `host` is not an address of this machine.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(128)
    except OSError as e:
        sock.close()
        why = "is in use" if e.errno == errno.EADDRINUSE else f"cannot be bound ({e.strerror})"
        raise ServeAddressError(
            f"{host}:{port} {why}: choose another --port or --host", setting="--port"
        ) from e
    return sock


@contextlib.asynccontextmanager
async def run_proxy(
    proxy: SwitchingProxy, sock: socket.socket, *, shutdown_timeout_s: float = 30.0
) -> AsyncIterator[None]:
    """Serve `proxy` on `sock` (from `listen_socket`) while the block runs; on exit stop
    accepting, give open requests `shutdown_timeout_s` to finish, and close the socket.

    Signals are left to the caller: uvicorn's own handlers are not installed (they would
    re-raise the signal after the shutdown, before the caller stops its backends)."""
    import uvicorn

    class _Server(uvicorn.Server):
        @contextlib.contextmanager
        def capture_signals(self) -> Iterator[None]:
            yield

    config = uvicorn.Config(
        proxy.app(),
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=max(1, int(shutdown_timeout_s)),
        lifespan="on",
    )
    server = _Server(config)
    task = asyncio.create_task(server.serve(sockets=[sock]), name="serving-proxy")
    try:
        yield
    finally:
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sock.close()
