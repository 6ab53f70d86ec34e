"""A real HTTP server on 127.0.0.1 that speaks the OpenAI chat-completions wire format.

Not a mock: the `openai:` policy talks to it over TCP with httpx, exactly as it talks to
vLLM or llama.cpp. What it answers is scripted per request (`actions`), so tests can
produce the failures a real endpoint produces (500s, 429s, garbage, stalls, huge bodies).

A stall is a gate, not a clock: a `hold` action keeps its request open until the test
calls `release()` (or the server stops), and `wait_held(n)` returns once `n` requests
are held, so a test interrupts or times out a run at a known point without sleeping.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tasks.types import TaskInstance

Action = dict[str, Any]


def reply(text: str, **extra: Any) -> Action:
    """A normal completion with `text` as the assistant content."""
    return {"kind": "ok", "text": text, **extra}


def held(
    action: Action | None = None, *, when: Callable[[dict[str, Any]], bool] | None = None
) -> Action:
    """A request held open until `ChatServer.release()`, then answered with `action` (by
    default an empty completion; a client that timed out meanwhile never reads it).
    `when(body)`: hold only the requests it accepts, answer the others at once."""
    return {"kind": "hold", "then": action or reply(""), "when": when}


def is_episode_turn(body: dict[str, Any]) -> bool:
    """A request of an episode's turn, not the endpoint probe (`max_tokens` 1)."""
    return body.get("max_tokens") != 1


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
        answers = [*calls, render_final(task.reference_final)]
        if texts.setdefault(task.prompt, answers) != answers:
            raise ValueError(f"two tasks share the prompt of {task.task_id}: pick others")

    def answer(body: dict[str, Any]) -> str:
        messages = body["messages"]
        if not is_episode_turn(body):
            return "ok"
        turn = sum(1 for m in messages if m["role"] == "assistant")
        return texts[messages[1]["content"]][turn]

    return {"kind": "script", "answer": answer}


def oracle_until(tasks: Sequence[TaskInstance], answered: int) -> Action:
    """`oracle(tasks)` answering the turns of the first `answered` tasks (in plan order) at
    once and holding the later tasks' turns until `release()`: a run that stops mid-way at
    a point the test knows (the earlier tasks' episodes done, every worker mid-episode with
    its jail open), however fast the machine."""
    late = {t.prompt for t in tasks[answered:]}

    def is_late_turn(body: dict[str, Any]) -> bool:
        return is_episode_turn(body) and body["messages"][1]["content"] in late

    return held(oracle(tasks), when=is_late_turn)


BY_PROMPT_TEMPLATES = [
    "config_update", "csv_to_json", "dir_tree", "fix_script", "rename_files", "summary_stats",
]  # fmt: skip
"""Built-in templates whose instances of seeds 0-2 have prompts of their own (`oracle`
answers by prompt and refuses a clash: csv_to_json's seed 3 repeats seed 0's)."""


class ChatServer:
    """Serves `POST /v1/chat/completions`; each request pops the next action (the last one repeats).

    Actions: `ok` (a completion of `text`), `hold` (`held`: stall until `release()`, then
    answer with `then`), `status` (that HTTP status), `garbage` (200 with an HTML page),
    `empty_choices`, `script` (`answer(body) -> text` computes the completion from the
    request). An `ok` action's `choice_fields` and `body_fields` are added to its choice
    and to the body.
    """

    def __init__(self, actions: list[Action] | None = None, *, port: int = 0) -> None:
        self.actions: deque[Action] = deque(actions or [])
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self._lock = threading.Lock()
        self._gate = threading.Event()
        self._held = 0
        self._held_changed = threading.Condition()
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

    def wait_held(self, count: int = 1, *, timeout_s: float = 60.0) -> None:
        """Return once `count` requests have been held by `hold` actions (the run is where
        the test wants it). `timeout_s` only bounds a broken test; nothing is timed by it."""
        with self._held_changed:
            if not self._held_changed.wait_for(lambda: self._held >= count, timeout=timeout_s):
                raise AssertionError(f"{self._held} of {count} requests held after {timeout_s} s")

    def release(self) -> None:
        """Answer every held request, and every later `hold` at once."""
        self._gate.set()

    def _serve(self, handler: Any, action: Action, body: dict[str, Any]) -> None:
        if action["kind"] == "hold" and (action["when"] is None or action["when"](body)):
            with self._held_changed:
                self._held += 1
                self._held_changed.notify_all()
            self._gate.wait()
        if action["kind"] == "hold":
            action = action["then"]
        kind = action["kind"]
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
        self.release()  # held handler threads finish (their clients are gone)
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(timeout=5)
