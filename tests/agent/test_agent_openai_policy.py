"""The `openai:` policy against a real chat-completions server on 127.0.0.1 (tests/agent/chat_server.py)."""

from __future__ import annotations

import asyncio
import socket

import pytest
from pydantic import SecretStr

from agent.errors import PolicyError, PolicyHTTPError, PolicyResponseError, PolicyTimeout
from agent.loop import run_episode
from agent.policies import OpenAIPolicy, PolicyRequest, make_policy
from agent.prompt import PromptStyle, render_system_prompt
from agent.render import render_final, render_tool_call
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import EpisodeStatus, FailureCategory, ParseKind
from sandbox.tool_specs import BUILTIN_TOOLS
from tests.agent.chat_server import Action, ChatServer, held, reply
from tests.agent.conftest import MemoryOpener, memory_verify

FAST = PolicySettings(
    backoff_initial_s=0.01, backoff_max_s=0.05, max_retries=2, request_timeout_s=5
)


def request_for(task, step_index: int = 0) -> PolicyRequest:
    return PolicyRequest(
        task=task,
        messages=[{"role": "user", "content": task.prompt}],
        tools=list(BUILTIN_TOOLS.values()),
        step_index=step_index,
        seed=7,
    )


def respond(policy: OpenAIPolicy, task):
    async def go():
        try:
            return await policy.respond(request_for(task))
        finally:
            await policy.aclose()

    return asyncio.run(go())


def oracle_texts(task) -> list[str]:
    calls = [
        render_tool_call(f"c{i + 1}", c.tool, c.args) for i, c in enumerate(task.reference_solution)
    ]
    return [*calls, render_final(task.reference_final)]


def test_completion_text_usage_and_request_body(task) -> None:
    with ChatServer([reply("hello")]) as server:
        policy = make_policy(
            f"openai:{server.base_url}#tiny-model?temperature=0.3&max_tokens=99",
            settings=FAST.model_copy(update={"api_key": SecretStr("sk-test")}),
        )
        assert isinstance(policy, OpenAIPolicy)
        response = respond(policy, task)
    assert response.text == "hello"
    assert response.prompt_tokens == 51 and response.completion_tokens == 7
    assert response.latency_ms is not None and response.latency_ms > 0
    assert response.finish_reason == "stop" and response.model == "tiny-model"
    body = server.requests[0]
    assert (
        body["model"] == "tiny-model"
        and body["temperature"] == 0.3
        and body["max_tokens"] == 99
        and body["seed"] == 7
    )
    assert body["messages"] == [{"role": "user", "content": task.prompt}]
    assert "tools" not in body
    assert server.headers[0]["Authorization"] == "Bearer sk-test"


def test_retries_with_backoff_on_5xx_and_429(task) -> None:
    actions = [
        {"kind": "status", "status": 500},
        {"kind": "status", "status": 429, "headers": {"Retry-After": "0"}},
        reply("finally"),
    ]
    with ChatServer(actions) as server:
        response = respond(OpenAIPolicy(server.base_url, "m", FAST), task)
    assert response.text == "finally"
    assert len(server.requests) == 3


def test_persistent_500_is_an_http_error_after_the_retries(task) -> None:
    with (
        ChatServer([{"kind": "status", "status": 503}]) as server,
        pytest.raises(PolicyHTTPError) as info,
    ):
        respond(OpenAIPolicy(server.base_url, "m", FAST), task)
    assert info.value.status_code == 503
    assert len(server.requests) == FAST.max_retries + 1


def test_client_errors_are_not_retried(task) -> None:
    with (
        ChatServer([{"kind": "status", "status": 400}]) as server,
        pytest.raises(PolicyHTTPError, match="HTTP 400"),
    ):
        respond(OpenAIPolicy(server.base_url, "m", FAST), task)
    assert len(server.requests) == 1


@pytest.mark.parametrize(
    ("action", "message"),
    [({"kind": "garbage"}, "not JSON"), ({"kind": "empty_choices"}, "empty choice list")],
)
def test_garbage_and_empty_choices(task, action, message) -> None:
    with ChatServer([action]) as server, pytest.raises(PolicyResponseError, match=message):
        respond(OpenAIPolicy(server.base_url, "m", FAST), task)


def test_a_stalled_endpoint_times_out(task) -> None:
    settings = FAST.model_copy(update={"request_timeout_s": 0.2, "max_retries": 1})
    with ChatServer([held()]) as server, pytest.raises(PolicyTimeout):
        respond(OpenAIPolicy(server.base_url, "m", settings), task)


def test_content_as_text_parts(task) -> None:
    parts = [{"type": "text", "text": "<final>"}, {"type": "text", "text": "ok</final>"}]
    with ChatServer([{"kind": "ok", "content": parts}]) as server:
        assert respond(OpenAIPolicy(server.base_url, "m", FAST), task).text == "<final>ok</final>"
    with (
        ChatServer([{"kind": "ok", "content": {"weird": 1}}]) as server,
        pytest.raises(PolicyResponseError, match="content"),
    ):
        respond(OpenAIPolicy(server.base_url, "m", FAST), task)


def test_connection_refused_is_a_policy_error(task) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    with pytest.raises(PolicyError, match="failed after 3 attempt"):
        respond(OpenAIPolicy(f"http://127.0.0.1:{port}/v1", "m", FAST), task)


def test_oversized_body_is_refused(task) -> None:
    settings = FAST.model_copy(update={"max_response_bytes": 4096})
    with (
        ChatServer([reply("x" * 10_000)]) as server,
        pytest.raises(PolicyResponseError, match="exceeds"),
    ):
        respond(OpenAIPolicy(server.base_url, "m", settings), task)


def run_with(server, task, spec, settings=None, policy_settings=FAST):
    policy = make_policy(f"openai:{server.base_url}#loop-model", settings=policy_settings)
    return run_with_policy(policy, task, spec, settings)


def run_with_policy(policy, task, spec, settings=None):
    async def go():
        try:
            return await run_episode(
                task,
                policy,
                spec=spec,
                run_key="http",
                settings=settings or LoopSettings(),
                open_sandbox=MemoryOpener(),
                verify=memory_verify,
            )
        finally:
            await policy.aclose()

    return asyncio.run(go())


def test_episode_through_the_endpoint_succeeds(task, spec) -> None:
    with ChatServer([reply(t) for t in oracle_texts(task)]) as server:
        traj = run_with(server, task, spec)
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason
    assert traj.policy.startswith("openai:http://127.0.0.1")
    assert all(
        s.prompt_tokens and s.completion_tokens == 7 and s.generation_latency_ms for s in traj.steps
    )
    # Each request carried the whole history: system, task, then one assistant + one observation per step.
    assert [len(r["messages"]) for r in server.requests] == [
        2 + 2 * i for i in range(len(server.requests))
    ]
    assert server.requests[1]["messages"][3]["content"].startswith(
        '<tool_result id="c1" name="list_dir"'
    )


def test_the_compact_prompt_is_sent_when_the_spec_asks(task, spec) -> None:
    # A checkpoint trained on the compact prompt, served: the remote policy cannot read its
    # training config, the spec says the style.
    compact = render_system_prompt(BUILTIN_TOOLS.values(), PromptStyle.COMPACT)
    with ChatServer([reply(t) for t in oracle_texts(task)]) as server:
        policy = make_policy(
            f"openai:{server.base_url}#m?prompt_style=compact", settings=PolicySettings()
        )
        traj = run_with_policy(policy, task, spec)
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason
    assert all(r["messages"][0]["content"] == compact for r in server.requests)
    full = make_policy("openai:http://127.0.0.1:1/v1#m", settings=PolicySettings()).system_prompt(
        BUILTIN_TOOLS.values()
    )
    assert full == render_system_prompt(BUILTIN_TOOLS.values(), PromptStyle.FULL)


@pytest.mark.parametrize(
    "failure", [{"kind": "garbage"}, {"kind": "empty_choices"}, {"kind": "status", "status": 500}]
)
def test_endpoint_failure_mid_episode_keeps_the_steps(task, spec, failure) -> None:
    # An endpoint failing after the retries is infrastructure, never the agent's.
    texts = oracle_texts(task)
    with ChatServer([reply(texts[0]), reply(texts[1]), failure]) as server:
        traj = run_with(server, task, spec)
    assert (traj.status, traj.failure_category) == (
        EpisodeStatus.ENDPOINT_ERROR,
        FailureCategory.ENDPOINT_ERROR,
    )
    assert traj.failure_reason
    assert len(traj.steps) == 2


def test_stalled_endpoint_mid_episode_is_an_endpoint_error(task, spec) -> None:
    texts = oracle_texts(task)
    settings = FAST.model_copy(update={"request_timeout_s": 0.2, "max_retries": 0})
    with ChatServer([reply(texts[0]), held()]) as server:
        traj = run_with(server, task, spec, policy_settings=settings)
    assert traj.failure_category == FailureCategory.ENDPOINT_ERROR and "EndpointTimeout" in (
        traj.failure_reason or ""
    )
    assert len(traj.steps) == 1


def test_a_10_mb_answer_from_the_endpoint_is_capped(task, spec) -> None:
    huge = "B" * (10 * 1024 * 1024)
    with ChatServer([reply(huge), reply(render_final("done"))]) as server:
        traj = run_with(server, task, spec)
    first = traj.steps[0]
    assert first.raw_output_truncated and len(first.raw_output) == LoopSettings().max_output_chars
    assert first.parse_kind == ParseKind.NONE
    assert traj.steps[1].parse_kind == ParseKind.FINAL


def test_native_tool_calls_are_parsed_and_answered_with_tool_messages(task, spec) -> None:
    native = [
        {
            "id": "call_abc",
            "type": "function",
            "function": {"name": "read_file", "arguments": '{"path": "data/in.txt"}'},
        }
    ]
    actions = [{"kind": "ok", "text": None, "tool_calls": native}, reply(render_final("done"))]
    with ChatServer(actions) as server:
        traj = run_with(
            server, task, spec, policy_settings=FAST.model_copy(update={"native_tools": True})
        )
    step = traj.steps[0]
    assert step.native_tool_calls == native
    assert (step.parse_kind, step.call_id, step.tool, step.args) == (
        ParseKind.TOOL_CALL,
        "call_abc",
        "read_file",
        {"path": "data/in.txt"},
    )
    assert [t["function"]["name"] for t in server.requests[0]["tools"]] == list(BUILTIN_TOOLS)
    second = server.requests[1]["messages"]
    assert second[2]["tool_calls"] == native
    assert second[3]["role"] == "tool" and second[3]["tool_call_id"] == "call_abc"
    assert "hello" in second[3]["content"]


def test_retries_are_counted_logged_and_the_model_recorded(task, spec, caplog) -> None:
    texts = oracle_texts(task)
    actions: list[Action] = [
        {"kind": "garbage"},
        {"kind": "status", "status": 502},
        *map(reply, texts),
    ]
    caplog.set_level("WARNING", logger="agent.policies.openai_compat")
    with ChatServer(actions) as server:
        traj = run_with(server, task, spec)
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason
    # An HTML 200 is retried like a 5xx; the first step needed two retries.
    assert [s.endpoint_retries for s in traj.steps] == [2] + [0] * (len(traj.steps) - 1)
    assert {s.response_model for s in traj.steps} == {"loop-model"}
    lines = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(lines) == 2
    assert "HTTP 200 with a body that is not JSON" in lines[0] and "attempt 1 of 3" in lines[0]
    assert "HTTP 502 (attempt 2 of 3); retrying in" in lines[1]
    assert all(server.base_url in line for line in lines)


def test_probe_names_the_url_when_nothing_listens() -> None:
    from agent.errors import EndpointError
    from agent.policies.openai_compat import probe_endpoint

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    url = f"http://127.0.0.1:{port}/v1"
    with pytest.raises(EndpointError, match=f"the model endpoint {url} cannot be reached") as info:
        asyncio.run(probe_endpoint(url, "m", FAST, deadline_s=2.0))
    assert "\n" not in info.value.user_message()


@pytest.mark.parametrize(
    ("action", "message"),
    [
        ({"kind": "garbage"}, "answered a 1-token completion with a body that is not JSON"),
        ({"kind": "status", "status": 404}, "answered HTTP 404"),
        (held(), "gave no completion within 0.3 s"),
    ],
)
def test_probe_fails_on_a_misbehaving_endpoint(action, message) -> None:
    from agent.errors import EndpointError

    with ChatServer([action]) as server:
        policy = OpenAIPolicy(server.base_url, "m", FAST)
        with pytest.raises(EndpointError, match=message):
            asyncio.run(policy.probe(deadline_s=0.3))


def test_probe_returns_the_answering_model() -> None:
    with ChatServer([reply("x")]) as server:
        policy = OpenAIPolicy(server.base_url, "served-name", FAST)
        assert asyncio.run(policy.probe(deadline_s=5.0)) == "served-name"
        assert server.requests[0]["max_tokens"] == 1


def _vllm_reply(text: str, ids: list[int], *, as_strings: bool = False, prompt=(1, 2, 3)) -> Action:
    """A completion shaped as vLLM answers `logprobs`, `return_token_ids` and
    `return_tokens_as_token_ids`."""
    content = [
        {"token": f"token_id:{i}" if as_strings else "x", "logprob": -0.5 * (n + 1)}
        for n, i in enumerate(ids)
    ]
    choice: dict[str, object] = {"logprobs": {"content": content}}
    if not as_strings:
        choice["token_ids"] = ids
    return reply(text, choice_fields=choice, body_fields={"prompt_token_ids": list(prompt)})


def test_token_ids_and_logprobs_are_recorded_when_the_server_returns_them(task, spec) -> None:
    """vLLM's `prompt_token_ids`, `token_ids` and logprobs land on the steps; with the
    ids only as `token_id:<id>` strings they are read from there; the request asks for
    them only when `request_token_ids` is set."""
    texts = oracle_texts(task)
    actions = [
        _vllm_reply(texts[0], [5, 6, 7]),
        _vllm_reply(texts[1], [8, 9], as_strings=True, prompt=(1, 2, 3, 5, 6, 7, 4)),
        *(reply(t) for t in texts[2:]),
    ]
    with ChatServer(actions) as server:
        settings = FAST.model_copy(update={"request_token_ids": True})
        policy = make_policy(f"openai:{server.base_url}#m", settings=settings)

        async def go():
            try:
                return await run_episode(
                    task,
                    policy,
                    spec=spec,
                    run_key="ids",
                    settings=LoopSettings(),
                    open_sandbox=MemoryOpener(),
                    verify=memory_verify,
                )
            finally:
                await policy.aclose()

        traj = asyncio.run(go())
        asked = server.requests[0]
    assert traj.status == EpisodeStatus.SUCCESS, traj.failure_reason
    assert (asked["logprobs"], asked["return_token_ids"], asked["return_tokens_as_token_ids"]) == (
        True,
        True,
        True,
    )
    first, second, third = traj.steps[:3]
    assert (first.prompt_token_ids, first.completion_token_ids) == ([1, 2, 3], [5, 6, 7])
    assert first.logprobs == [-0.5, -1.0, -1.5]
    assert (second.completion_token_ids, second.logprobs) == ([8, 9], [-0.5, -1.0])
    assert second.prompt_token_ids == [1, 2, 3, 5, 6, 7, 4]
    # `transformers serve` and most servers return none: nothing is made up.
    assert (third.prompt_token_ids, third.completion_token_ids, third.logprobs) == (None,) * 3


def test_logprobs_that_do_not_align_with_the_ids_are_dropped(task) -> None:
    action = reply(
        "hi",
        choice_fields={
            "token_ids": [1, 2],
            "logprobs": {"content": [{"token": "h", "logprob": -1}]},
        },
    )
    with ChatServer([action]) as server:
        answer = respond(OpenAIPolicy(server.base_url, "m", FAST), task)
        body = server.requests[0]
    assert (answer.completion_token_ids, answer.logprobs) == ([1, 2], None)
    assert "logprobs" not in body and "return_token_ids" not in body
