"""`openai:` policy: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, Ollama,
llama.cpp, `transformers serve`).

Async HTTP (httpx) with retries and exponential backoff on transport errors, timeouts,
408/409/425/429/5xx and 2xx bodies that are not a chat completion (an HTML error page from
a proxy, a truncated body); a `Retry-After` header is honoured and every retry is one
WARNING line (endpoint, status or error, attempt, wait). What still fails after the
retries is an `EndpointError`: the loop ends the episode as `endpoint_error`, an
infrastructure outcome. What the endpoint refuses on purpose (400, 413, 422: the history
outgrew the context) and answers over the body cap are `PolicyError`s: `policy_error`.
Token usage, latency, the retry count and the answering model go on the step, and so do
the token ids and logprobs when the endpoint returns them: vLLM does when asked
(`PolicySettings.request_token_ids`: `logprobs`, `return_token_ids`,
`return_tokens_as_token_ids`), giving the prompt ids it rendered and the ids it sampled;
`transformers serve` returns none. The server renders each turn's history from text, so
unlike the `hf:` policy's, these prompt ids need not extend the previous turn's.
The system prompt is the full one unless `PolicySettings.prompt_style` (spec key
`prompt_style`) says the served checkpoint was trained on the compact one.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterable
from typing import Any

import httpx

from agent.errors import (
    EndpointError,
    EndpointHTTPError,
    EndpointResponseError,
    EndpointTimeout,
    PolicyHTTPError,
    PolicyResponseError,
)
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.prompt import render_system_prompt
from agent.settings import PolicySettings
from sandbox.tool_specs import ToolSpec

__all__ = ["OpenAIPolicy", "probe_endpoint"]

logger = logging.getLogger(__name__)

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
_MISCONFIGURED_STATUS = frozenset({401, 403, 404})
"""Not retried, and not the agent's: a wrong key, URL or model name."""


class _NotACompletion(PolicyResponseError):
    """Internal: a 2xx body that is not a chat completion (retried like a 5xx; after the
    retries the policy raises `EndpointResponseError` with its reason)."""


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        return None


def _int_or_none(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _content_text(content: Any) -> str | None:
    """Message content as text; some servers send a list of `{"type": "text", "text": …}` parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and all(
        isinstance(p, dict) and p.get("type") == "text" and isinstance(p.get("text"), str)
        for p in content
    ):
        return "".join(p["text"] for p in content)
    raise _NotACompletion(
        f"message content is {type(content).__name__}, expected a string or text parts"
    )


_TOKEN_ID_PREFIX = "token_id:"


def _int_list(value: Any) -> list[int] | None:
    if isinstance(value, list) and all(
        isinstance(v, int) and not isinstance(v, bool) for v in value
    ):
        return list(value)
    return None


def _sampled_tokens(
    choice: dict[str, Any],
) -> tuple[list[int] | None, list[float] | None]:
    """The ids and logprobs a choice says were sampled: ids from vLLM's `token_ids`, else
    from logprob entries written `token_id:<id>` (`return_tokens_as_token_ids`); logprobs
    only when they align one to one with the ids."""
    ids = _int_list(choice.get("token_ids"))
    raw = choice.get("logprobs")
    content = raw.get("content") if isinstance(raw, dict) else None
    if not isinstance(content, list) or not all(isinstance(e, dict) for e in content):
        return ids, None
    if ids is None:
        tokens = [e.get("token") for e in content]
        if content and all(
            isinstance(t, str)
            and t.startswith(_TOKEN_ID_PREFIX)
            and t[len(_TOKEN_ID_PREFIX) :].isdigit()
            for t in tokens
        ):
            ids = [int(str(t)[len(_TOKEN_ID_PREFIX) :]) for t in tokens]
    values = [e.get("logprob") for e in content]
    if ids is None or len(values) != len(ids):
        return ids, None
    if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in values):
        return ids, None
    return ids, [float(v) for v in values]


def parse_completion(payload: bytes) -> PolicyResponse:
    """A chat-completions body as a `PolicyResponse` (latency and retries left unset).

    Raises:
        _NotACompletion: the body is not a usable chat completion (why, one line).
    """
    try:
        data = json.loads(payload)
    except ValueError as e:
        excerpt = payload[:200].decode("utf-8", errors="replace")
        raise _NotACompletion(f"a body that is not JSON: {excerpt!r}") from e
    if not isinstance(data, dict):
        raise _NotACompletion(f"JSON that is not an object: {type(data).__name__}")
    choices = data.get("choices")
    if not isinstance(choices, list):
        raise _NotACompletion("a response with no 'choices' list")
    if not choices:
        raise _NotACompletion("an empty choice list")
    choice = choices[0]
    message = choice.get("message") if isinstance(choice, dict) else None
    if not isinstance(message, dict):
        raise _NotACompletion("a first choice with no 'message' object")
    content = _content_text(message.get("content"))
    tool_calls = message.get("tool_calls")
    if tool_calls is not None and not isinstance(tool_calls, list):
        raise _NotACompletion("message tool_calls that is not a list")
    raw_usage = data.get("usage")
    usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
    finish = choice.get("finish_reason")
    model = data.get("model")
    completion_ids, logprobs = _sampled_tokens(choice)
    return PolicyResponse(
        text=content or "",
        native_tool_calls=tool_calls or None,
        prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
        completion_tokens=_int_or_none(usage.get("completion_tokens")),
        finish_reason=finish if isinstance(finish, str) else None,
        model=model if isinstance(model, str) else None,
        prompt_token_ids=_int_list(data.get("prompt_token_ids")),
        completion_token_ids=completion_ids,
        logprobs=logprobs,
    )


class OpenAIPolicy(Policy):
    """Chat completions at `base_url` (the part before `/chat/completions`) with `model`."""

    def __init__(
        self, base_url: str, model: str, settings: PolicySettings, *, spec: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.endpoint = self.base_url
        self.model = model
        self.settings = settings
        self.spec = spec or f"openai:{self.base_url}#{model}"
        self._client: httpx.AsyncClient | None = None
        self._client_loop: asyncio.AbstractEventLoop | None = None

    def _http(self) -> httpx.AsyncClient:
        # A client is bound to the event loop that created it; collection runs one loop,
        # but tests and the CLI may run several in sequence.
        loop = asyncio.get_running_loop()
        if self._client is None or self._client_loop is not loop or self._client.is_closed:
            self._client = httpx.AsyncClient(
                headers=_headers(self.settings), timeout=self.settings.request_timeout_s
            )
            self._client_loop = loop
        return self._client

    def _body(self, request: PolicyRequest) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self.model,
            "messages": request.messages,
            "temperature": self.settings.temperature,
            "max_tokens": self.settings.max_tokens,
            "seed": request.seed,
        }
        if self.settings.native_tools:
            body["tools"] = [t.openai_tool() for t in request.tools]
        if self.settings.request_token_ids:
            body["logprobs"] = True
            body["return_token_ids"] = True
            body["return_tokens_as_token_ids"] = True
        return body

    async def _post_once(self, body: dict[str, Any]) -> tuple[int, bytes, httpx.Response]:
        url = f"{self.base_url}/chat/completions"
        cap = self.settings.max_response_bytes
        async with self._http().stream("POST", url, json=body) as response:
            chunks: list[bytes] = []
            size = 0
            async for chunk in response.aiter_bytes():
                size += len(chunk)
                if size > cap:
                    raise PolicyResponseError(f"endpoint response exceeds {cap} bytes")
                chunks.append(chunk)
            return response.status_code, b"".join(chunks), response

    async def _complete(self, body: dict[str, Any]) -> PolicyResponse:
        """One chat completion, retried; `retries` on the response says how many retries.

        Raises:
            EndpointError: every attempt failed (transport, timeout, 429/5xx, not a
                completion), or the endpoint answered 401/403/404.
            PolicyHTTPError: the endpoint refused the request (another 4xx).
            PolicyResponseError: the body is over the cap.
        """
        delay = self.settings.backoff_initial_s
        attempts = self.settings.max_retries + 1
        last: EndpointError | None = None
        for attempt in range(attempts):
            wait: float | None = None
            tried = attempt + 1
            try:
                status, payload, response = await self._post_once(body)
            except httpx.TimeoutException as e:
                reason = f"timeout ({type(e).__name__})"
                last = EndpointTimeout(
                    f"request to {self.base_url} timed out after {tried} attempt(s): {e!r}",
                    endpoint=self.base_url,
                    attempts=tried,
                )
                last.__cause__ = e
            except httpx.TransportError as e:
                reason = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
                last = EndpointError(
                    f"request to {self.base_url} failed after {tried} attempt(s): {e!r}",
                    endpoint=self.base_url,
                    attempts=tried,
                )
                last.__cause__ = e
            else:
                if 200 <= status < 300:
                    try:
                        answer = parse_completion(payload)
                    except _NotACompletion as e:
                        reason = f"HTTP {status} with {e}"
                        last = EndpointResponseError(
                            f"endpoint {self.base_url} answered HTTP {status} with {e} "
                            f"after {tried} attempt(s)",
                            endpoint=self.base_url,
                            attempts=tried,
                        )
                    else:
                        return answer.model_copy(update={"retries": attempt})
                else:
                    excerpt = payload[:300].decode("utf-8", errors="replace")
                    message = (
                        f"endpoint {self.base_url} answered HTTP {status} after {tried} "
                        f"attempt(s): {excerpt}"
                    )
                    if status in _MISCONFIGURED_STATUS:
                        raise EndpointHTTPError(
                            message, endpoint=self.base_url, attempts=tried, status_code=status
                        )
                    if status not in _RETRY_STATUS:
                        raise PolicyHTTPError(message, status_code=status)
                    reason = f"HTTP {status}"
                    last = EndpointHTTPError(
                        message, endpoint=self.base_url, attempts=tried, status_code=status
                    )
                    wait = _retry_after(response)
            if tried < attempts:
                pause = min(self.settings.backoff_max_s, max(delay, wait or 0.0))
                logger.warning(
                    "endpoint %s: %s (attempt %d of %d); retrying in %.2f s",
                    self.base_url,
                    reason[:200],
                    tried,
                    attempts,
                    pause,
                )
                await asyncio.sleep(pause)
                delay *= 2
        assert last is not None
        raise last

    def system_prompt(self, tools: Iterable[ToolSpec]) -> str:
        """The prompt in `settings.prompt_style` (`full` unless the endpoint serves a
        checkpoint trained on the compact prompt)."""
        return render_system_prompt(tools, self.settings.prompt_style)

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        started = time.perf_counter()
        answer = await self._complete(self._body(request))
        return answer.model_copy(update={"latency_ms": (time.perf_counter() - started) * 1000.0})

    async def probe(self, *, deadline_s: float) -> str | None:
        return await probe_endpoint(self.base_url, self.model, self.settings, deadline_s=deadline_s)

    async def aclose(self) -> None:
        client, loop = self._client, self._client_loop
        self._client = None
        # A client from a loop that has ended cannot be closed from this one; its sockets
        # went with that loop.
        if client is not None and not client.is_closed and loop is asyncio.get_running_loop():
            await client.aclose()


def _headers(settings: PolicySettings) -> dict[str, str]:
    headers = {"Content-Type": "application/json"}
    if settings.api_key:
        headers["Authorization"] = f"Bearer {settings.api_key.get_secret_value()}"
    return headers


async def probe_endpoint(
    base_url: str, model: str, settings: PolicySettings, *, deadline_s: float
) -> str:
    """Ask the endpoint for a 1-token chat completion within `deadline_s` and return the
    model it says answered; preflight's check that a collection has something to talk to.

    A completion rather than `GET /models`: it proves the model is loaded and answers
    (a server whose model list is fine can still fail every completion).

    Raises:
        EndpointError: no completion within the deadline, an HTTP error or a body that is
            not a chat completion; the message names the URL.
    """
    base_url = base_url.rstrip("/")
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "ping"}],
        "max_tokens": 1,
        "temperature": 0.0,
    }
    try:
        async with httpx.AsyncClient(headers=_headers(settings), timeout=deadline_s) as client:
            async with asyncio.timeout(deadline_s):
                response = await client.post(f"{base_url}/chat/completions", json=body)
    except (TimeoutError, httpx.TimeoutException) as e:
        raise EndpointTimeout(
            f"the model endpoint {base_url} gave no completion within {deadline_s:g} s",
            endpoint=base_url,
        ) from e
    except httpx.TransportError as e:
        raise EndpointError(
            f"the model endpoint {base_url} cannot be reached: {type(e).__name__}: {e}",
            endpoint=base_url,
        ) from e
    if not 200 <= response.status_code < 300:
        excerpt = response.text[:200].replace("\n", " ")
        raise EndpointHTTPError(
            f"the model endpoint {base_url} answered HTTP {response.status_code} to a "
            f"1-token completion of {model!r}: {excerpt}",
            endpoint=base_url,
            attempts=1,
            status_code=response.status_code,
        )
    try:
        answer = parse_completion(response.content)
    except _NotACompletion as e:
        raise EndpointResponseError(
            f"the model endpoint {base_url} answered a 1-token completion with {e}",
            endpoint=base_url,
        ) from e
    return answer.model or model
