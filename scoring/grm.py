"""The LLM judge (GRM, seed 003 §2): the rubric as a prompt to any OpenAI-compatible endpoint.

A judge that never sinks the gate:

- transport failures, HTTP 429 and 5xx, and bodies that are not a chat-completions answer
  are retried (`GrmSettings.retries`) with exponential backoff and jitter, honouring a
  `Retry-After` header; each retry is logged;
- the answer schema is asked for as structured output (`response_format` with a JSON
  schema); an endpoint that rejects it (HTTP 400) is asked again without it, once per
  judge, and the answer is parsed from text;
- `judge_many` turns every unusable judgement into data — a `Judgement` with
  `parsed=False` and `parse_error` starting `unscored:` with the reason (endpoint
  unavailable after the retries, invalid body, answer off the schema) — so one failed
  episode never aborts the gate. `judge` alone still raises after the last retry.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Sequence
from typing import Any

import httpx
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, stop_after_attempt

from agent.trajectory import Trajectory
from scoring.errors import JudgeError, JudgeResponseInvalid, JudgeUnavailable
from scoring.grm_prompt import ANSWER_JSON_SCHEMA, AnswerUnparseable, build_messages, parse_answer
from scoring.rubric import Judgement
from scoring.settings import GrmSettings

__all__ = ["UNSCORED", "GrmJudge", "unscored_reason"]

logger = logging.getLogger(__name__)

UNSCORED = "unscored: "
"""Prefix of `Judgement.parse_error` for a judgement that carries no scores."""

RETRIED_STATUS = frozenset({408, 409, 425, 429, 500, 502, 503, 504})
"""HTTP statuses worth asking again (rate limits, timeouts, overloaded or failing servers)."""


class _Retryable(JudgeError):
    """A failure the next attempt may not have (wraps the error that is finally raised)."""

    def __init__(self, error: JudgeError, retry_after: float | None = None) -> None:
        super().__init__(str(error))
        self.error = error
        self.retry_after = retry_after


def unscored_reason(judgement: Judgement) -> str | None:
    """Why `judgement` carries no scores (None when it does)."""
    if judgement.parsed:
        return None
    return (judgement.parse_error or "").removeprefix(UNSCORED) or "no reason recorded"


def _retry_after(response: httpx.Response) -> float | None:
    value = response.headers.get("retry-after")
    try:
        return max(0.0, float(value)) if value is not None else None
    except ValueError:
        return None  # an HTTP date: the backoff decides


class GrmJudge:
    """Asks a chat-completions endpoint to score trajectories with the shared rubric."""

    def __init__(self, settings: GrmSettings, client: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        self._client = client
        self._structured = settings.structured_output
        self.name = f"grm:{settings.model}"
        """`judge` value of this judge's judgements."""

    def _headers(self) -> dict[str, str]:
        if self._settings.api_key is None:
            return {}
        return {"Authorization": f"Bearer {self._settings.api_key.get_secret_value()}"}

    def _body(self, messages: list[dict[str, str]]) -> dict[str, Any]:
        body: dict[str, Any] = {
            "model": self._settings.model,
            "messages": messages,
            "temperature": self._settings.temperature,
            "max_tokens": self._settings.max_tokens,
        }
        if self._structured:
            body["response_format"] = {
                "type": "json_schema",
                "json_schema": {
                    "name": "rubric_judgement",
                    "schema": ANSWER_JSON_SCHEMA,
                    "strict": True,
                },
            }
        return body

    async def _attempt(self, client: httpx.AsyncClient, messages: list[dict[str, str]]) -> str:
        """One request (two when the endpoint refuses structured output); the answer text."""
        url = self._settings.base_url.rstrip("/") + "/chat/completions"
        try:
            response = await client.post(
                url,
                json=self._body(messages),
                headers=self._headers(),
                timeout=self._settings.timeout_s,
            )
            if response.status_code == 400 and self._structured:
                logger.info(
                    "GRM endpoint %s refused response_format (HTTP 400: %s); asking without "
                    "structured output from now on",
                    url,
                    response.text[:120],
                )
                self._structured = False
                response = await client.post(
                    url,
                    json=self._body(messages),
                    headers=self._headers(),
                    timeout=self._settings.timeout_s,
                )
        except httpx.HTTPError as e:
            raise _Retryable(JudgeUnavailable(f"judge endpoint {url} unreachable: {e!r}")) from e
        if response.status_code // 100 != 2:
            error = JudgeUnavailable(
                f"judge endpoint {url} answered HTTP {response.status_code}: {response.text[:200]}"
            )
            if response.status_code in RETRIED_STATUS:
                raise _Retryable(error, _retry_after(response))
            raise error
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise _Retryable(
                JudgeResponseInvalid(
                    f"judge endpoint {url} returned no chat-completions answer: {response.text[:200]}"
                )
            ) from e
        if not isinstance(content, str):
            raise _Retryable(
                JudgeResponseInvalid(
                    f"judge endpoint {url} returned non-text content: {content!r}"[:300]
                )
            )
        return content

    def _wait(self, state: RetryCallState) -> float:
        """Exponential backoff with jitter, at least the server's `Retry-After`, capped."""
        s = self._settings
        base = min(s.max_backoff_s, s.backoff_s * 2 ** (state.attempt_number - 1))
        delay = base + random.uniform(0.0, base)
        error = state.outcome.exception() if state.outcome is not None else None
        if isinstance(error, _Retryable) and error.retry_after is not None:
            delay = max(delay, error.retry_after)
        return float(min(delay, s.max_backoff_s))

    async def _complete(
        self, client: httpx.AsyncClient, messages: list[dict[str, str]], episode: str
    ) -> str:
        attempts = self._settings.retries + 1

        def log_retry(state: RetryCallState) -> None:
            error = state.outcome.exception() if state.outcome is not None else None
            sleep = state.next_action.sleep if state.next_action is not None else 0.0
            logger.warning(
                "GRM judge, episode %s: %s; retry %d/%d in %.1f s",
                episode,
                error,
                state.attempt_number,
                attempts - 1,
                sleep,
            )

        try:
            async for attempt in AsyncRetrying(
                stop=stop_after_attempt(attempts),
                wait=self._wait,
                retry=retry_if_exception_type(_Retryable),
                before_sleep=log_retry,
                reraise=True,
            ):
                with attempt:
                    return await self._attempt(client, messages)
        except _Retryable as e:
            raise type(e.error)(f"{e.error} (after {attempts} attempt(s))") from e
        raise AssertionError("unreachable: tenacity returns or raises")  # pragma: no cover

    async def _judge(self, client: httpx.AsyncClient, trajectory: Trajectory) -> Judgement:
        messages = build_messages(trajectory, self._settings.max_observation_chars)
        started = time.perf_counter()
        answer = await self._complete(client, messages, str(trajectory.episode_id))
        common = {
            "episode_id": str(trajectory.episode_id),
            "judge": self.name,
            "raw_answer": answer,
            "latency_ms": (time.perf_counter() - started) * 1000.0,
        }
        try:
            rubric = parse_answer(answer, trajectory.n_steps)
        except AnswerUnparseable as e:
            return Judgement(parsed=False, parse_error=f"{UNSCORED}{e}", rubric=None, **common)
        return Judgement(parsed=True, rubric=rubric, **common)

    async def judge(self, trajectory: Trajectory) -> Judgement:
        """Score one trajectory; an answer off the schema comes back with `parsed=False`.

        Raises:
            JudgeUnavailable: the endpoint could not be reached or answered non-2xx, after
                the retries.
            JudgeResponseInvalid: the endpoint's body is not a chat-completions response,
                after the retries.
        """
        if self._client is not None:
            return await self._judge(self._client, trajectory)
        async with httpx.AsyncClient() as client:
            return await self._judge(client, trajectory)

    def _unscored(self, trajectory: Trajectory, reason: str) -> Judgement:
        return Judgement(
            episode_id=str(trajectory.episode_id),
            judge=self.name,
            parsed=False,
            parse_error=f"{UNSCORED}{reason}",
            rubric=None,
        )

    async def judge_many(self, trajectories: Sequence[Trajectory]) -> list[Judgement]:
        """Judge several trajectories, at most `settings.concurrency` requests in flight, in
        order. Never raises for one episode: what could not be judged comes back unscored
        with the reason (and is logged)."""
        semaphore = asyncio.Semaphore(self._settings.concurrency)

        async def one(client: httpx.AsyncClient, trajectory: Trajectory) -> Judgement:
            async with semaphore:
                try:
                    return await self._judge(client, trajectory)
                except JudgeError as e:
                    logger.warning(
                        "GRM judge, episode %s: recorded unscored: %s", trajectory.episode_id, e
                    )
                    return self._unscored(trajectory, str(e))
                except Exception as e:  # a bug must not sink the gate either; it is logged
                    logger.exception(
                        "GRM judge, episode %s: unexpected error", trajectory.episode_id
                    )
                    return self._unscored(trajectory, f"{type(e).__name__}: {e}")

        async def run(client: httpx.AsyncClient) -> list[Judgement]:
            return list(await asyncio.gather(*(one(client, t) for t in trajectories)))

        if self._client is not None:
            judgements = await run(self._client)
        else:
            async with httpx.AsyncClient() as client:
                judgements = await run(client)
        unscored = sum(not j.parsed for j in judgements)
        if unscored:
            logger.warning(
                "GRM judge %s: %d of %d episodes unscored", self.name, unscored, len(judgements)
            )
        return judgements
