"""`WS /ws` over a real uvicorn, with a real websockets client: OpenEnv's messages, the
typed error of each bad input on its session, the token, and no jail left behind."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import uvicorn
from sqlalchemy import Engine, text
from websockets.asyncio.client import ClientConnection, connect
from websockets.exceptions import InvalidStatus

from config.settings import load_settings
from environment.hub import HubConfig
from environment.server import serve
from environment.wire import MAX_MESSAGE_BYTES
from storage import migrate
from storage.db import make_engine
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from suites.builtin import builtin_suite
from tests.services.postgres import free_port

TEMPLATE = "csv_to_json"
TOKEN = "s3cret-token"


class Served:
    def __init__(self, engine: Engine, port: int) -> None:
        self.engine = engine
        self.port = port

    @property
    def ws(self) -> str:
        return f"ws://127.0.0.1:{self.port}/ws"

    @property
    def http(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def statuses(self) -> list[tuple[str, str | None]]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                text("SELECT status, failure_reason FROM episode ORDER BY started_at")
            ).all()
        return [(r[0], r[1]) for r in rows]


def _serve(tmp_path: Path, *, token: str | None, **config: Any) -> Iterator[Served]:
    engine = make_engine(DatabaseSettings(url=f"sqlite:///{tmp_path / 'env.db'}"))
    migrate.upgrade(engine)
    config.setdefault("templates", [TEMPLATE])
    port = free_port()
    servers: list[uvicorn.Server] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            asyncio.run(
                serve(
                    HubConfig(run_key="served", **config),
                    load_settings(),
                    host="127.0.0.1",
                    port=port,
                    token=token,
                    engine=engine,
                    store=LocalObjectStore(tmp_path / "objects"),
                    ready=servers.append,
                )
            )
        except BaseException as e:  # reported by the fixture, not lost in the thread
            failed.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    while not (servers and servers[0].started):
        if not thread.is_alive():
            raise RuntimeError("the server did not start") from (failed[0] if failed else None)
        threading.Event().wait(0.02)
    try:
        yield Served(engine, port)
    finally:
        servers[0].should_exit = True
        thread.join(timeout=60)
        assert not thread.is_alive()
        assert not failed, failed
        engine.dispose()


@pytest.fixture
def served(tmp_path: Path) -> Iterator[Served]:
    yield from _serve(tmp_path, token=None, max_sessions=2, idle_timeout_s=3.0)


async def _ask(ws: ClientConnection, message: Any) -> dict[str, Any]:
    await ws.send(message if isinstance(message, str) else json.dumps(message))
    answer: dict[str, Any] = json.loads(await ws.recv())
    return answer


def _error(answer: dict[str, Any], code: str) -> None:
    assert answer["type"] == "error" and answer["data"]["code"] == code, answer


def test_describe_endpoints(served: Served) -> None:
    assert httpx.get(f"{served.http}/health").json() == {"status": "healthy"}
    schema = httpx.get(f"{served.http}/schema").json()
    assert {"action", "observation", "state", "reset"} <= set(schema)
    assert "tool" in schema["action"]["properties"]
    metadata = httpx.get(f"{served.http}/metadata").json()
    assert metadata["run_key"] == "served" and metadata["max_message_bytes"] == MAX_MESSAGE_BYTES


def test_reset_steps_done_with_the_oracle_calls(served: Served) -> None:
    task = builtin_suite().generate(TEMPLATE, 3)

    async def main() -> dict[str, Any]:
        async with connect(served.ws) as ws:
            # The client offers permessage-deflate; the server declines (CPU per step).
            assert ws.response is not None
            assert "Sec-WebSocket-Extensions" not in ws.response.headers
            first = await _ask(ws, {"type": "reset", "data": {"template": TEMPLATE, "seed": 3}})
            assert first["type"] == "observation", first
            assert first["data"]["observation"]["instruction"] == task.prompt
            assert first["data"]["done"] is False
            for call in task.reference_solution:
                answer = await _ask(
                    ws, {"type": "step", "data": {"tool": call.tool, "arguments": call.args}}
                )
                assert answer["data"]["done"] is False and answer["data"]["reward"] is not None
            state = await _ask(ws, {"type": "state"})
            assert state["type"] == "state" and state["data"]["status"] == "running"
            final = await _ask(ws, {"type": "step", "data": {"final": task.reference_final or ""}})
            _error(await _ask(ws, {"type": "step", "data": {"final": "again"}}), "episode_done")
            return final

    final = asyncio.run(main())
    assert final["data"]["done"] is True and final["data"]["observation"]["success"] is True
    with served.engine.connect() as conn:
        stored = conn.execute(text("SELECT final_reward, status FROM episode")).one()
    assert final["data"]["reward"] == stored[0] and stored[1] == "success"


def test_bad_messages_are_typed_errors_on_their_session(served: Served) -> None:
    async def main() -> None:
        async with connect(served.ws, max_size=None) as ws:
            _error(await _ask(ws, "{not json"), "bad_json")
            _error(await _ask(ws, {"type": "dance", "data": {}}), "unknown_type")
            _error(await _ask(ws, {"type": "step", "data": {"final": "x"}}), "no_session")
            big = json.dumps({"type": "step", "data": {"message": "x" * MAX_MESSAGE_BYTES}})
            _error(await _ask(ws, big), "too_large")
            reset = {"type": "reset", "data": {"template": "no_such_template"}}
            _error(await _ask(ws, reset), "unknown_task")
            first = await _ask(ws, {"type": "reset", "data": {"template": TEMPLATE}})
            episode = first["data"]["observation"]["episode_id"]
            other = {"final": "x", "episode_id": "00000000-0000-0000-0000-000000000000"}
            _error(await _ask(ws, {"type": "step", "data": other}), "wrong_session")
            _error(await _ask(ws, {"type": "step", "data": {"tool": 3}}), "bad_action")
            # the session survives every one of them
            done = await _ask(ws, {"type": "step", "data": {"final": "x", "episode_id": episode}})
            assert done["data"]["done"] is True

    asyncio.run(main())
    assert [s for s, _ in served.statuses()] == ["failed"]


def test_capacity_is_refused_at_once(served: Served) -> None:
    async def main() -> None:
        async with connect(served.ws) as a, connect(served.ws) as b, connect(served.ws) as c:
            for ws in (a, b):
                assert (await _ask(ws, {"type": "reset", "data": {}}))["type"] == "observation"
            answer = await asyncio.wait_for(_ask(c, {"type": "reset", "data": {}}), timeout=5)
            _error(answer, "capacity")

    asyncio.run(main())


def test_a_client_leaving_mid_step_and_one_never_sending_leave_no_jail(served: Served) -> None:
    async def main() -> None:
        async with connect(served.ws) as ws:
            await _ask(ws, {"type": "reset", "data": {}})
            await ws.send(
                json.dumps(
                    {
                        "type": "step",
                        "data": {"tool": "execute_shell", "arguments": {"command": "sleep 1"}},
                    }
                )
            )
        # connected, reset, then silent: closed at the idle deadline (3 s here)
        async with connect(served.ws) as ws:
            await _ask(ws, {"type": "reset", "data": {}})
            answer = json.loads(await asyncio.wait_for(ws.recv(), timeout=20))
            _error(answer, "idle")
        # connected and never sent anything at all
        async with connect(served.ws) as ws:
            _error(json.loads(await asyncio.wait_for(ws.recv(), timeout=20)), "idle")

    asyncio.run(main())
    # both episodes stored as the client's outcome, with the reason (a closed session's
    # episode is stored after its client has heard why)
    statuses = _statuses_once_stored(served, 2)
    assert [s for s, _ in statuses] == ["policy_error", "policy_error"], statuses
    assert "disconnected mid-step" in (statuses[0][1] or "")


def _statuses_once_stored(served: Served, n: int) -> list[tuple[str, str | None]]:
    """The stored episodes once there are `n` (the server stores a session's episode after
    its client has gone: an event to wait for, not a time); fails after 60 s without."""
    for _ in range(1200):
        statuses = served.statuses()
        if len(statuses) >= n:
            return statuses
        threading.Event().wait(0.05)
    raise AssertionError(f"fewer than {n} episodes stored: {served.statuses()}")


async def _refused_then_served(url: str, headers: dict[str, str]) -> None:
    with pytest.raises(InvalidStatus) as refused:
        async with connect(url):
            pass
    assert refused.value.response.status_code == 401
    async with connect(url, additional_headers=headers) as ws:
        assert (await _ask(ws, {"type": "reset", "data": {}}))["type"] == "observation"


def test_a_token_guards_every_request_but_health(tmp_path: Path) -> None:
    for served in _serve(tmp_path, token=TOKEN):
        assert httpx.get(f"{served.http}/metadata").status_code == 401
        assert httpx.get(f"{served.http}/health").status_code == 200
        headers = {"Authorization": f"Bearer {TOKEN}"}
        assert httpx.get(f"{served.http}/metadata", headers=headers).status_code == 200

        asyncio.run(_refused_then_served(served.ws, headers))
        # The served client's session ends when it disconnects, stored as its outcome by
        # the server's thread in its own time; the refused client stored nothing.
        statuses = _statuses_once_stored(served, 1)
        assert [s for s, _ in statuses] == ["policy_error"], statuses
        assert "client disconnected" in (statuses[0][1] or "")
