"""LLM judge (GRM) against a real loopback chat-completions server.

The HTTP server is real (`http.server` on 127.0.0.1, a thread); only the model behind it
is stubbed: it returns canned judge answers queued by each test — valid answers, HTTP 429
and 5xx, garbage bodies, answers off the schema — so retries, structured output and
"unscored" judgements are exercised over real sockets.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

from scoring.errors import JudgeResponseInvalid, JudgeUnavailable
from scoring.grm import UNSCORED, GrmJudge, unscored_reason
from scoring.grm_prompt import AnswerUnparseable, parse_answer, render_trajectory
from scoring.rubric import Dimension
from scoring.settings import GrmSettings
from tests.scoring.qc_builders import PERTURBATIONS, oracle


class ChatServer:
    """A chat-completions endpoint whose replies are queued: (status, body) pairs."""

    def __init__(self) -> None:
        self.replies: list[tuple[int, Any] | tuple[int, Any, dict[str, str]]] = []
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers["Content-Length"])
                server.requests.append({"path": self.path, **json.loads(self.rfile.read(length))})
                server.headers.append(dict(self.headers))
                reply = server.replies.pop(0)
                status, body = reply[0], reply[1]
                payload = body.encode() if isinstance(body, str) else json.dumps(body).encode()
                self.send_response(status)
                for name, value in (reply[2] if len(reply) > 2 else {}).items():
                    self.send_header(name, value)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base_url = f"http://127.0.0.1:{self._httpd.server_address[1]}/v1"
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        self._thread.start()

    def answer(self, content: str) -> None:
        self.replies.append(
            (200, {"choices": [{"index": 0, "message": {"role": "assistant", "content": content}}]})
        )

    def close(self) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)


@pytest.fixture
def chat_server() -> Iterator[ChatServer]:
    server = ChatServer()
    yield server
    server.close()


def settings(server: ChatServer, **kw: Any) -> GrmSettings:
    kw.setdefault("backoff_s", 0.01)
    kw.setdefault("max_backoff_s", 0.05)
    return GrmSettings(base_url=server.base_url, model="judge-1", **kw)


GOOD: dict[str, Any] = {
    "scores": {"completion": 5, "tool_correctness": 4, "reliability": 2, "cost": 5, "safety": 5},
    "deductions": [
        {
            "dimension": "reliability",
            "points": 3,
            "steps": [2],
            "reason": "quotes total=99, never observed",
        },
        {"dimension": "tool_correctness", "points": 1, "steps": [1], "reason": "malformed block"},
    ],
    "suggestion": "Quote only what the tools returned.",
}


def test_parsed_answer_and_request_shape(chat_server: ChatServer) -> None:
    chat_server.answer(json.dumps(GOOD))
    t = PERTURBATIONS["fabricated_claim"]()
    j = asyncio.run(GrmJudge(settings(chat_server, api_key="k")).judge(t))
    assert j.parsed and j.rubric is not None
    assert (j.judge, j.episode_id) == ("grm:judge-1", str(t.episode_id))
    assert j.rubric.reliability == 2 and j.rubric.mean == pytest.approx(21 / 5)
    assert [(d.dimension, d.steps) for d in j.rubric.deductions] == [
        (Dimension.RELIABILITY, [2]),
        (Dimension.TOOL_CORRECTNESS, [1]),
    ]
    assert j.raw_answer == json.dumps(GOOD)
    [req] = chat_server.requests
    assert (
        req["path"] == "/v1/chat/completions"
        and req["model"] == "judge-1"
        and req["temperature"] == 0.0
    )
    system, user = req["messages"]
    assert "reliability" in system["content"] and "fabricated" in system["content"]
    assert "[step 2] agent:" in user["content"] and "verifier score=1.00" in user["content"]
    assert chat_server.headers[0]["Authorization"] == "Bearer k"


def test_fenced_json_is_accepted(chat_server: ChatServer) -> None:
    chat_server.answer("```json\n" + json.dumps(GOOD) + "\n```")
    j = asyncio.run(GrmJudge(settings(chat_server)).judge(PERTURBATIONS["fabricated_claim"]()))
    assert j.parsed


@pytest.mark.parametrize(
    ("answer", "why"),
    [
        ("The trajectory looks fine, 5/5.", "not one JSON object"),
        ("Here you go: " + json.dumps(GOOD), "not one JSON object"),
        (json.dumps({**GOOD, "scores": {**GOOD["scores"], "cost": 7}}), "within 0–5"),
        (
            json.dumps(
                {**GOOD, "scores": {k: v for k, v in GOOD["scores"].items() if k != "safety"}}
            ),
            "missing keys ['safety']",
        ),
        (json.dumps({**GOOD, "verdict": "good"}), "unexpected keys ['verdict']"),
        (
            json.dumps({**GOOD, "deductions": [{**GOOD["deductions"][0], "steps": [42]}]}),
            "not a step of this trajectory",
        ),
        (
            json.dumps({**GOOD, "deductions": [{**GOOD["deductions"][0], "steps": []}]}),
            "cite at least one step",
        ),
        (json.dumps({**GOOD, "scores": {**GOOD["scores"], "cost": True}}), "must be a number"),
        (json.dumps({**GOOD, "suggestion": "one\ntwo"}), "one non-empty line"),
    ],
)
def test_unparseable_answers_are_recorded_not_scored(
    chat_server: ChatServer, answer: str, why: str
) -> None:
    chat_server.answer(answer)
    j = asyncio.run(GrmJudge(settings(chat_server)).judge(PERTURBATIONS["fabricated_claim"]()))
    assert not j.parsed and j.rubric is None
    assert j.raw_answer == answer
    assert j.parse_error is not None and why in j.parse_error
    assert unscored_reason(j) is not None and j.parse_error.startswith(UNSCORED)
    assert len(chat_server.requests) == 1  # an answer off the schema is data, not retried


def test_http_error_raises_unavailable_after_the_retries(chat_server: ChatServer) -> None:
    chat_server.replies += [(503, {"error": "overloaded"})] * 3
    with pytest.raises(JudgeUnavailable, match=r"503.*after 3 attempt"):
        asyncio.run(GrmJudge(settings(chat_server, retries=2)).judge(oracle()))
    assert len(chat_server.requests) == 3


def test_client_error_is_not_retried(chat_server: ChatServer) -> None:
    chat_server.replies.append((401, {"error": "bad key"}))
    with pytest.raises(JudgeUnavailable, match="401"):
        asyncio.run(GrmJudge(settings(chat_server, retries=3)).judge(oracle()))
    assert len(chat_server.requests) == 1


def test_non_chat_body_raises_invalid(chat_server: ChatServer) -> None:
    chat_server.replies.append((200, {"result": "ok"}))
    with pytest.raises(JudgeResponseInvalid):
        asyncio.run(GrmJudge(settings(chat_server, retries=0)).judge(oracle()))


def test_unreachable_endpoint_raises_unavailable() -> None:
    s = GrmSettings(base_url="http://127.0.0.1:9/v1", timeout_s=2.0, retries=1, backoff_s=0.01)
    with pytest.raises(JudgeUnavailable, match="after 2 attempt"):
        asyncio.run(GrmJudge(s).judge(oracle()))


def test_429_500_and_garbage_are_retried_until_a_valid_answer(
    chat_server: ChatServer, caplog: pytest.LogCaptureFixture
) -> None:
    chat_server.replies += [
        (429, {"error": "slow down"}, {"Retry-After": "0.05"}),
        (500, "<html>internal error</html>"),
        (200, "this is not JSON at all"),
    ]
    chat_server.answer(json.dumps(GOOD))
    with caplog.at_level("WARNING", logger="scoring.grm"):
        j = asyncio.run(
            GrmJudge(settings(chat_server, retries=3)).judge(PERTURBATIONS["fabricated_claim"]())
        )
    assert j.parsed and j.rubric is not None and j.rubric.reliability == 2
    assert len(chat_server.requests) == 4
    retries = [r.getMessage() for r in caplog.records if "retry" in r.getMessage()]
    assert len(retries) == 3 and "429" in retries[0] and "500" in retries[1]
    assert "retry 1/3" in retries[0]


def test_structured_output_is_asked_for_and_dropped_when_refused(chat_server: ChatServer) -> None:
    chat_server.answer(json.dumps(GOOD))
    chat_server.replies.append((400, {"error": "response_format is not supported"}))
    chat_server.answer(json.dumps(GOOD))
    chat_server.answer(json.dumps(GOOD))
    judge = GrmJudge(settings(chat_server))
    t = PERTURBATIONS["fabricated_claim"]()
    assert asyncio.run(judge.judge(t)).parsed
    first = chat_server.requests[0]["response_format"]
    assert first["type"] == "json_schema"
    assert first["json_schema"]["schema"]["required"] == ["scores", "deductions", "suggestion"]
    assert asyncio.run(judge.judge(t)).parsed  # 400 → asked again without response_format
    assert asyncio.run(judge.judge(t)).parsed  # and not offered again
    assert ["response_format" in r for r in chat_server.requests] == [True, True, False, False]


def test_one_failed_judgement_never_sinks_the_batch(chat_server: ChatServer) -> None:
    """Concurrency 1 keeps the queue's order: episode 0 gets two 500s (unscored after its
    retries), episode 1 garbage then a valid answer, episode 2 an answer off the schema."""
    chat_server.replies += [(500, {"error": "boom"}), (502, "bad gateway")]
    chat_server.replies += [(200, "garbage")]
    chat_server.answer(json.dumps(GOOD))
    chat_server.answer("I think it is fine.")
    trajectories = [PERTURBATIONS["fabricated_claim"](rollout=i) for i in range(3)]
    judgements = asyncio.run(
        GrmJudge(settings(chat_server, retries=1, concurrency=1)).judge_many(trajectories)
    )
    assert [j.episode_id for j in judgements] == [str(t.episode_id) for t in trajectories]
    down, ok, off = judgements
    assert not down.parsed and down.rubric is None and down.raw_answer is None
    reason = unscored_reason(down)
    assert reason is not None and "502" in reason and "after 2 attempt" in reason
    assert ok.parsed and unscored_reason(ok) is None
    assert not off.parsed and "not one JSON object" in (unscored_reason(off) or "")


def test_judge_many_keeps_order_and_bounds_concurrency(chat_server: ChatServer) -> None:
    for _ in range(5):
        chat_server.answer(json.dumps(GOOD))
    trajectories = [PERTURBATIONS["fabricated_claim"](rollout=i) for i in range(5)]
    judgements = asyncio.run(
        GrmJudge(settings(chat_server, concurrency=2)).judge_many(trajectories)
    )
    assert [j.episode_id for j in judgements] == [str(t.episode_id) for t in trajectories]
    assert all(j.parsed for j in judgements)


def test_render_caps_long_observations() -> None:
    t = oracle()
    t.steps[1].observation = "x" * 5000
    text = render_trajectory(t, 200)
    assert "[4800 more chars]" in text


def test_parse_answer_directly() -> None:
    r = parse_answer(json.dumps(GOOD), n_steps=4)
    assert r.suggestion == "Quote only what the tools returned."
    with pytest.raises(AnswerUnparseable):
        parse_answer(json.dumps(GOOD), n_steps=2)
