"""The switching front of `epiflow models serve` (`agent.serving_proxy`): two real chat
servers as backends (`tests.agent.chat_server`, real HTTP over TCP; standing in for two
`transformers serve` processes, which `tests/training/test_alias_serving.py` starts for
real), the real Starlette app under uvicorn on a loopback port, httpx as the client.

A switch sends new requests to the new backend while a request held open on the old one
finishes there, and the old backend reports drained only once it has."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from agent.errors import ServeAddressError
from agent.serving import ServedModel
from agent.serving_proxy import (
    BACKEND_HEADER,
    ProxyBackend,
    SwitchingProxy,
    listen_socket,
    run_proxy,
)
from tests.agent.chat_server import ChatServer, held, reply


def _backend(server: ChatServer, label: str, tmp_path: Path) -> ProxyBackend:
    served = ServedModel(
        base_url=server.base_url, model=f"/models/{label}", log_path=tmp_path, pid=0
    )
    return ProxyBackend(served, label=label)


def test_a_switch_keeps_the_url_and_lets_the_old_backend_finish(tmp_path: Path) -> None:
    with (
        ChatServer([held(reply("from a"))]) as a,
        ChatServer([reply("from b")]) as b,
    ):
        old = _backend(a, "ckpt-a", tmp_path)
        proxy = SwitchingProxy("champion", old)
        sock = listen_socket("127.0.0.1", 0)
        url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1"
        body = {"model": "champion", "messages": [{"role": "user", "content": "hi"}]}

        async def scenario() -> None:
            async with run_proxy(proxy, sock), httpx.AsyncClient(timeout=60) as client:
                first = asyncio.create_task(client.post(f"{url}/chat/completions", json=body))
                await asyncio.to_thread(a.wait_held, 1)
                assert old.in_flight == 1

                assert proxy.switch(_backend(b, "ckpt-b", tmp_path)) is old
                second = await client.post(f"{url}/chat/completions", json=body)
                assert second.status_code == 200, second.text
                assert second.headers[BACKEND_HEADER] == "ckpt-b"
                assert second.json()["model"] == "/models/ckpt-b"
                assert second.json()["choices"][0]["message"]["content"] == "from b"
                assert not first.done() and old.in_flight == 1
                assert not await old.drained(timeout_s=0.05)

                a.release()
                answered = await first
                assert answered.status_code == 200, answered.text
                assert answered.headers[BACKEND_HEADER] == "ckpt-a"
                assert answered.json()["choices"][0]["message"]["content"] == "from a"
                assert await old.drained(timeout_s=30)

                listed = (await client.get(f"{url}/models")).json()["data"]
                assert [(m["id"], m["backend"]) for m in listed] == [("champion", "ckpt-b")]

                wrong = await client.post(
                    f"{url}/chat/completions", json={**body, "model": "other"}
                )
                assert wrong.status_code == 404
                assert "send model 'champion'" in wrong.json()["error"]["message"]

        asyncio.run(scenario())
        # Each backend was asked for its own model, whatever the client named.
        assert [r["model"] for r in a.requests] == ["/models/ckpt-a"]
        assert [r["model"] for r in b.requests] == ["/models/ckpt-b"]


def test_a_taken_port_is_one_error_naming_the_flag() -> None:
    taken = listen_socket("127.0.0.1", 0)
    try:
        with pytest.raises(ServeAddressError, match="is in use") as caught:
            listen_socket("127.0.0.1", taken.getsockname()[1])
        assert caught.value.setting == "--port"
    finally:
        taken.close()
