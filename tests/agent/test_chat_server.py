"""The test model server's gate: a held request waits for the test, not for a clock."""

from __future__ import annotations

import threading

import httpx

from tests.agent.chat_server import ChatServer, held, is_episode_turn, reply


def _ask(server: ChatServer, answers: list[str], **fields: object) -> None:
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}], **fields}
    response = httpx.post(f"{server.base_url}/chat/completions", json=body, timeout=60)
    answers.append(response.json()["choices"][0]["message"]["content"])


def test_a_held_request_is_answered_when_the_test_releases_it() -> None:
    with ChatServer([reply("first"), held(reply("second"))]) as server:
        answers: list[str] = []
        _ask(server, answers)
        asker = threading.Thread(target=_ask, args=(server, answers))
        asker.start()
        server.wait_held(1)
        assert answers == ["first"]  # held: not answered until released
        server.release()
        asker.join(timeout=60)
        assert answers == ["first", "second"]
        _ask(server, answers)  # released: a later hold answers at once
        assert answers[-1] == "second"


def test_a_hold_with_a_condition_answers_the_other_requests_at_once() -> None:
    with ChatServer([held(reply("turn"), when=is_episode_turn)]) as server:
        answers: list[str] = []
        _ask(server, answers, max_tokens=1)  # the endpoint probe is not held
        assert answers == ["turn"]
        asker = threading.Thread(target=_ask, args=(server, answers))
        asker.start()
        server.wait_held(1)
        server.release()
        asker.join(timeout=60)
        assert answers == ["turn", "turn"]
