"""`epiflow env serve`: OpenEnv's protocol over a `SessionHub` (FastAPI + uvicorn).

`WS /ws` is one client's connection; it holds at most one session at a time (a reset
while one is open closes and stores it first). Each message gets one answer (`close`
gets none), and every failure is an `error` message on that connection with its code
(`environment.errors`), never a server crash or a jail left behind:

| what the client did                        | code             |
|--------------------------------------------|------------------|
| a frame that is not JSON                   | `bad_json`       |
| a type other than reset/step/state/close   | `unknown_type`   |
| a frame over `MAX_MESSAGE_BYTES`           | `too_large`      |
| a reset naming no served task              | `unknown_task`   |
| a step after the episode ended             | `episode_done`   |
| a step naming another session's episode    | `wrong_session`  |
| a step or state before any reset           | `no_session`     |
| a reset with every session slot taken      | `capacity`       |
| nothing for `idle_timeout_s`               | `closed` / `idle`|
| an episode ended by the infrastructure     | `infrastructure` |

A client that disconnects mid-step has its session closed: the loop finishes the step,
gets no next action, and the episode is stored (`policy_error`). A client that never
sends anything is disconnected after `idle_timeout_s` (code `idle`), and its session, if
any, was already closed by the hub's idle deadline.

`GET /health`, `/schema` (JSON schemas of action, observation and state) and `/metadata`
describe the server. OpenEnv's stateless HTTP `/reset` and `/step` are not offered: an
epiflow episode lives in a jail across steps, which a request-per-step API cannot hold.

The server binds loopback unless told otherwise (`check_bind`); with a token every
request but `/health` needs `Authorization: Bearer <token>`, and one without it gets 401
before anything else happens (no session, no jail). `serve` opens the hub first and
only then binds the port, so what stops a run from opening (its run key held by another
live process, a database behind the code, an unusable store) is raised before anything
is served or any jail started. SIGTERM (uvicorn's graceful stop) closes the
connections, then the hub: every session's episode stored, the run ended, every jail
gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import ipaddress
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from fastapi import FastAPI, Request, WebSocket
from fastapi.responses import JSONResponse, Response
from sqlalchemy import Engine
from starlette.types import Message
from starlette.websockets import WebSocketDisconnect

from collection.request import CollectResult
from config.settings import Settings
from environment.actions import Action, parse_action
from environment.errors import (
    NoSession,
    ServeError,
    SessionError,
    WrongSession,
    client_code,
)
from environment.hub import HubConfig, SessionHub, open_hub
from environment.selection import TaskSelection, parse_selection
from environment.sessions import Session
from environment.wire import (
    MAX_MESSAGE_BYTES,
    SessionState,
    StepResult,
    error_message,
    read_message,
)
from storage.objects import ObjectStore

if TYPE_CHECKING:
    import uvicorn

__all__ = ["check_bind", "make_app", "make_server", "serve"]

logger = logging.getLogger(__name__)

WS_FRAME_LIMIT = 4 * MAX_MESSAGE_BYTES
"""The largest frame uvicorn accepts at all (larger ones close the connection, 1009);
frames between `MAX_MESSAGE_BYTES` and this get a `too_large` error instead."""


def is_loopback(host: str) -> bool:
    """Whether binding `host` keeps the server on this machine."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def check_bind(host: str, *, token: str | None, allow_remote: bool) -> None:
    """Refuse a bind beyond loopback unless it is asked for and guarded by a token.

    Raises:
        ServeError: `host` is not loopback and `allow_remote` is off, or no token is set.
    """
    if is_loopback(host):
        return
    if not allow_remote:
        raise ServeError(
            f"--host {host} is reachable from other machines: add --allow-remote",
            setting="--allow-remote",
        )
    if not token:
        raise ServeError(
            f"--host {host} needs a bearer token: set EPIFLOW_ENV_TOKEN (or --token)",
            setting="EPIFLOW_ENV_TOKEN",
        )


def _authorized(header: str | None, token: str | None) -> bool:
    if token is None:
        return True
    expected = f"Bearer {token}"
    return header is not None and hmac.compare_digest(header.encode(), expected.encode())


async def serve(
    config: HubConfig,
    settings: Settings,
    *,
    host: str,
    port: int,
    token: str | None = None,
    engine: Engine | None = None,
    store: ObjectStore | None = None,
    ready: Callable[[uvicorn.Server], None] | None = None,
) -> CollectResult | None:
    """Serve `config`'s sessions on `host:port` until SIGTERM/SIGINT (or the uvicorn
    server's `should_exit`); the run's result.

    The hub (the collection run: its lock, database, store) opens before the port is
    bound; `ready` gets the uvicorn server once it does (before it binds). On the way out
    the hub closes: every session's episode stored, the run ended, every jail gone.

    Raises:
        RequestError: the suite or a template does not exist.
        StorageError: the database or object store cannot be used, or the run key is
            being collected right now by another live process (`RunKeyBusy`, naming it).
    """
    async with open_hub(config, settings, engine=engine, store=store) as hub:
        server = make_server(make_app(hub, token=token), host=host, port=port)
        if ready is not None:
            ready(server)
        await server.serve()
    return hub.result


def make_app(hub: SessionHub, *, token: str | None = None) -> FastAPI:
    """The server's app over an open `hub` (its opener closes it)."""
    config = hub.config
    app = FastAPI(title="epiflow environment")

    @app.middleware("http")
    async def require_token(request: Request, call_next: Any) -> Response:
        if request.url.path != "/health" and not _authorized(
            request.headers.get("authorization"), token
        ):
            return JSONResponse({"detail": "a bearer token is required"}, status_code=401)
        response: Response = await call_next(request)
        return response

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "healthy"}

    @app.get("/metadata")
    async def metadata() -> dict[str, Any]:
        return {
            "name": "epiflow",
            "description": "epiflow tasks in nsjail sandboxes; every session a stored episode",
            "run_key": config.run_key,
            "suite": config.suite,
            "templates": config.templates,
            "max_sessions": config.max_sessions,
            "open_sessions": len(hub.sessions),
            "idle_timeout_s": config.idle_timeout_s,
            "max_message_bytes": MAX_MESSAGE_BYTES,
            "protocol": "OpenEnv WS /ws; actions in protocol v1 or native tool calls",
        }

    @app.get("/schema")
    async def schema() -> dict[str, Any]:
        return {
            "action": Action.model_json_schema(),
            "reset": TaskSelection.model_json_schema(),
            "observation": StepResult.model_json_schema(),
            "state": SessionState.model_json_schema(),
        }

    @app.websocket("/ws")
    async def ws(websocket: WebSocket) -> None:
        if not _authorized(websocket.headers.get("authorization"), token):
            await websocket.send_denial_response(
                JSONResponse({"detail": "a bearer token is required"}, status_code=401)
            )
            return
        await websocket.accept()
        await _Connection(websocket, hub).serve()

    return app


class _Connection:
    """One client's `WS /ws`: its messages, in order, and its one session."""

    def __init__(self, websocket: WebSocket, hub: SessionHub) -> None:
        self.websocket = websocket
        self.hub = hub
        self.session: Session | None = None
        self._incoming: asyncio.Future[Message] | None = None

    async def serve(self) -> None:
        try:
            while True:
                received = await self._receive(within_s=self.hub.config.idle_timeout_s)
                if received is None:  # the client never sent anything in time
                    await self._send(error_message("idle", "no message in time: disconnected"))
                    await self.websocket.close(code=1008)
                    return
                if received["type"] == "websocket.disconnect":
                    return
                raw = (
                    received.get("text")
                    if received.get("text") is not None
                    else received.get("bytes")
                )
                answer = await self._answer(raw or "")
                if answer is not None:
                    await self._send(answer)
        except WebSocketDisconnect:
            return
        finally:
            if self._incoming is not None:
                self._incoming.cancel()
            if self.session is not None and not self.session.done:
                # Shielded: the session's episode is stored whatever stops this handler.
                await asyncio.shield(self.hub.close(self.session, "the client disconnected"))

    async def _receive(self, *, within_s: float | None) -> Message | None:
        if self._incoming is None:
            self._incoming = asyncio.ensure_future(self.websocket.receive())
        done, _ = await asyncio.wait({self._incoming}, timeout=within_s)
        if not done:
            return None
        received, self._incoming = self._incoming.result(), None
        return received

    async def _send(self, message: dict[str, Any]) -> None:
        await self.websocket.send_json(message)

    async def _answer(self, raw: str | bytes) -> dict[str, Any] | None:
        try:
            kind, data = read_message(raw)
            if kind == "reset":
                return {"type": "observation", "data": await self._reset(data)}
            if kind == "step":
                return await self._step(data)
            if kind == "state":
                return {"type": "state", "data": self.hub.state(self._current())}
            if self.session is not None and not self.session.done:
                await self.hub.close(self.session, "the client closed the session")
            return None
        except SessionError as e:
            return error_message(client_code(e), str(e))

    def _current(self) -> Session:
        if self.session is None:
            raise NoSession("no session on this connection: send a reset first")
        return self.session

    async def _reset(self, data: Any) -> dict[str, Any]:
        selection = parse_selection(data)
        if self.session is not None and not self.session.done:
            await self.hub.close(self.session, "reset before the episode ended")
        self.session = None
        self.session, observation = await self.hub.reset(selection)
        return observation

    async def _step(self, data: Any) -> dict[str, Any] | None:
        session = self._current()
        action = parse_action(data)
        if action.episode_id is not None and action.episode_id != str(session.episode_id):
            raise WrongSession(
                f"this connection's episode is {session.episode_id}, not {action.episode_id}"
            )
        stepping = asyncio.ensure_future(self.hub.step(session, action))
        # Watch the connection while the step runs: a client gone mid-step closes its
        # session now (the loop gets no next action) instead of at the idle deadline.
        if self._incoming is None:
            self._incoming = asyncio.ensure_future(self.websocket.receive())
        watched: set[asyncio.Future[Any]] = {stepping, self._incoming}
        await asyncio.wait(watched, return_when=asyncio.FIRST_COMPLETED)
        if not stepping.done() and self._incoming.done():
            received = self._incoming.result()
            if received["type"] == "websocket.disconnect":
                self._incoming = None
                session.close("the client disconnected mid-step")
                with contextlib.suppress(SessionError):
                    await stepping
                raise WebSocketDisconnect(code=received.get("code", 1000))
        return {"type": "observation", "data": await stepping}


def make_server(app: FastAPI, *, host: str, port: int) -> uvicorn.Server:
    """The uvicorn server of `app` (its `serve()` runs until SIGTERM or `should_exit`)."""
    import uvicorn

    return uvicorn.Server(
        uvicorn.Config(
            app,
            host=host,
            port=port,
            ws_max_size=WS_FRAME_LIMIT,
            ws_ping_interval=None,
            # No permessage-deflate: a step's frames are small and the server's CPU per
            # step is what 64 sessions on a few cores queue behind (docs/trainers.md).
            ws_per_message_deflate=False,
            lifespan="off",  # the hub is opened and closed by `serve`, around uvicorn
            log_level="warning",
        )
    )
