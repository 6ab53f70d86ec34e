"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions wire format.

Not a mock: the `openai:` policy talks to it over TCP with httpx, exactly as it talks to
vLLM or llama.cpp. What it answers is scripted per request (`actions`), so tests can
produce the failures a real endpoint produces (500s, 429s, garbage, stalls, huge bodies).
"""

from __future__ import annotations

import json
import threading
import time
from collections import deque
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.types import TaskInstance

Action = dict[str, Any]


def reply(text: str, **extra: Any) -> Action:
    """A normal completion with `text` as the assistant content."""
    return {"kind": "ok", "text": text, **extra}


def oracle(tasks: Iterable[TaskInstance]) -> Action:
    """A `script` action answering each of `tasks` (found by its prompt) with its reference
    solution, turn by turn: a working model behind the endpoint."""
    from agent.render import render_final, render_tool_call

    texts: dict[str, list[str]] = {}
    for task in tasks:
        calls = [
            render_tool_call(f"c{i + 1}", c.tool, c.args)
            for i, c in enumerate(task.reference_solution)
        ]
        texts[task.prompt] = [*calls, render_final(task.reference_final)]

    def answer(body: dict[str, Any]) -> str:
        messages = body["messages"]
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return texts[messages[1]["content"]][turn]

    return {"kind": "script", "answer": answer}


class ChatServer:
    """Serves `POST /v1/chat/completions`; each request pops the next action (the last one repeats).

    Actions: `ok` (a completion of `text`), `sleep` (stall `seconds`, then answer), `status`
    (that HTTP status), `garbage` (200 with an HTML page), `empty_choices`, `script`
    (`answer(body) -> text` computes the completion from the request). An `ok` action's
    `choice_fields` and `body_fields` are added to its choice and to the body.
    """

    def __init__(self, actions: list[Action] | None = None, *, port: int = 0) -> None:
        self.actions: deque[Action] = deque(actions or [])
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                body = json.loads(self.rfile.read(length) or b"{}")
                with owner._lock:
                    owner.requests.append(body)
                    owner.headers.append(dict(self.headers.items()))
                    action = owner.actions.popleft() if len(owner.actions) > 1 else owner.actions[0]
                if self.path != "/v1/chat/completions":
                    self._send(404, b'{"error": "not found"}')
                    return
                owner._serve(self, action, body)

            def _send(
                self, status: int, payload: bytes, headers: dict[str, str] | None = None
            ) -> None:
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    for key, value in (headers or {}).items():
                        self.send_header(key, value)
                    self.end_headers()
                    self.wfile.write(payload)
                except (BrokenPipeError, ConnectionResetError):
                    return

        self.handler = Handler
        # `port`: a server started again where an earlier one died (an endpoint coming back).
        self.httpd = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def base_url(self) -> str:
        host, port = self.httpd.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def _serve(self, handler: Any, action: Action, body: dict[str, Any]) -> None:
        kind = action["kind"]
        if kind == "sleep":
            time.sleep(action["seconds"])
            kind = "ok"
        if kind == "status":
            handler._send(
                action["status"],
                b'{"error": {"message": "scripted failure"}}',
                action.get("headers"),
            )
            return
        if kind == "script":
            # The answer computed from the request (e.g. each task's reference solution).
            action = {"kind": "ok", "text": action["answer"](body)}
            kind = "ok"
        if kind == "garbage":
            handler._send(200, b"<html>502 Bad Gateway</html>")
            return
        if kind == "empty_choices":
            handler._send(
                200, json.dumps({"id": "x", "object": "chat.completion", "choices": []}).encode()
            )
            return
        message: dict[str, Any] = {
            "role": "assistant",
            "content": action.get("content", action.get("text", "")),
        }
        if "tool_calls" in action:
            message["tool_calls"] = action["tool_calls"]
            message["content"] = action.get("text")
        completion = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", "unknown"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if "tool_calls" in action else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": 50 + len(self.requests),
                "completion_tokens": 7,
                "total_tokens": 57 + len(self.requests),
            },
        }
        # What a server adds beyond OpenAI's fields (vLLM's token ids and logprobs).
        completion["choices"][0].update(action.get("choice_fields", {}))
        completion.update(action.get("body_fields", {}))
        handler._send(200, json.dumps(completion).encode())

    def __enter__(self) -> ChatServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
