"""`openai:` policy: any OpenAI-compatible chat-completions endpoint (vLLM, SGLang, Ollama, llama.cpp).

Async HTTP (httpx) with retries and exponential backoff on 429, 5xx and transport errors
(a `Retry-After` header is honoured), a cap on the response body, token usage and
latency. Anything that is not a usable completion after the retries is a `PolicyError`:
the loop ends the episode as `policy_error` and keeps the steps so far.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx

from agent.errors import PolicyError, PolicyHTTPError, PolicyResponseError, PolicyTimeout
from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.settings import PolicySettings

__all__ = ["OpenAIPolicy"]

_RETRY_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})


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
    raise PolicyResponseError(
        f"message content is {type(content).__name__}, expected a string or text parts"
    )


class OpenAIPolicy(Policy):
    """Chat completions at `base_url` (the part before `/chat/completions`) with `model`."""

    def __init__(
        self, base_url: str, model: str, settings: PolicySettings, *, spec: str | None = None
    ) -> None:
        self.base_url = base_url.rstrip("/")
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
            headers = {"Content-Type": "application/json"}
            if self.settings.api_key:
                headers["Authorization"] = f"Bearer {self.settings.api_key.get_secret_value()}"
            self._client = httpx.AsyncClient(
                headers=headers, timeout=self.settings.request_timeout_s
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

    async def _post(self, body: dict[str, Any]) -> bytes:
        delay = self.settings.backoff_initial_s
        attempts = self.settings.max_retries + 1
        last: PolicyError | None = None
        for attempt in range(attempts):
            wait: float | None = None
            try:
                status, payload, response = await self._post_once(body)
            except httpx.TimeoutException as e:
                last = PolicyTimeout(
                    f"request to {self.base_url} timed out after {attempt + 1} attempt(s): {e!r}"
                )
                last.__cause__ = e
            except httpx.TransportError as e:
                last = PolicyError(
                    f"request to {self.base_url} failed after {attempt + 1} attempt(s): {e!r}"
                )
                last.__cause__ = e
            else:
                if 200 <= status < 300:
                    return payload
                excerpt = payload[:300].decode("utf-8", errors="replace")
                last = PolicyHTTPError(
                    f"endpoint answered HTTP {status} after {attempt + 1} attempt(s): {excerpt}",
                    status_code=status,
                )
                if status not in _RETRY_STATUS:
                    raise last
                wait = _retry_after(response)
            if attempt + 1 < attempts:
                pause = min(self.settings.backoff_max_s, max(delay, wait or 0.0))
                await asyncio.sleep(pause)
                delay *= 2
        assert last is not None
        raise last

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        started = time.perf_counter()
        payload = await self._post(self._body(request))
        latency_ms = (time.perf_counter() - started) * 1000.0
        try:
            data = json.loads(payload)
        except ValueError as e:
            excerpt = payload[:200].decode("utf-8", errors="replace")
            raise PolicyResponseError(
                f"endpoint returned a body that is not JSON: {excerpt!r}"
            ) from e
        if not isinstance(data, dict):
            raise PolicyResponseError(
                f"endpoint returned JSON that is not an object: {type(data).__name__}"
            )
        choices = data.get("choices")
        if not isinstance(choices, list):
            raise PolicyResponseError("endpoint response has no 'choices' list")
        if not choices:
            raise PolicyResponseError("endpoint returned an empty choice list")
        choice = choices[0]
        message = choice.get("message") if isinstance(choice, dict) else None
        if not isinstance(message, dict):
            raise PolicyResponseError("endpoint response's first choice has no 'message' object")
        content = _content_text(message.get("content"))
        tool_calls = message.get("tool_calls")
        if tool_calls is not None and not isinstance(tool_calls, list):
            raise PolicyResponseError("message tool_calls is not a list")
        raw_usage = data.get("usage")
        usage: dict[str, Any] = raw_usage if isinstance(raw_usage, dict) else {}
        finish = choice.get("finish_reason")
        return PolicyResponse(
            text=content or "",
            native_tool_calls=tool_calls or None,
            prompt_tokens=_int_or_none(usage.get("prompt_tokens")),
            completion_tokens=_int_or_none(usage.get("completion_tokens")),
            latency_ms=latency_ms,
            finish_reason=finish if isinstance(finish, str) else None,
            model=data.get("model") if isinstance(data.get("model"), str) else None,
        )

    async def aclose(self) -> None:
        client, loop = self._client, self._client_loop
        self._client = None
        # A client from a loop that has ended cannot be closed from this one; its sockets
        # went with that loop.
        if client is not None and not client.is_closed and loop is asyncio.get_running_loop():
            await client.aclose()
