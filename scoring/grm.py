"""The LLM judge (GRM, seed 003 §2): the rubric as a prompt to any OpenAI-compatible endpoint.

Transport failures raise (`JudgeUnavailable`, `JudgeResponseInvalid`) so a flow can retry;
an answer that does not follow the schema becomes a `Judgement` with `parsed=False`, the
raw answer and the parse error — it is recorded, never scored.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

import httpx

from agent.trajectory import Trajectory
from scoring.errors import JudgeResponseInvalid, JudgeUnavailable
from scoring.grm_prompt import AnswerUnparseable, build_messages, parse_answer
from scoring.rubric import Judgement
from scoring.settings import GrmSettings

__all__ = ["GrmJudge"]


class GrmJudge:
    """Asks a chat-completions endpoint to score trajectories with the shared rubric."""

    def __init__(self, settings: GrmSettings, client: httpx.AsyncClient | None = None) -> None:
        self._settings = settings
        self._client = client
        self.name = f"grm:{settings.model}"
        """`judge` value of this judge's judgements."""

    def _headers(self) -> dict[str, str]:
        if self._settings.api_key is None:
            return {}
        return {"Authorization": f"Bearer {self._settings.api_key.get_secret_value()}"}

    async def _complete(self, client: httpx.AsyncClient, messages: list[dict[str, str]]) -> str:
        url = self._settings.base_url.rstrip("/") + "/chat/completions"
        body: dict[str, Any] = {
            "model": self._settings.model,
            "messages": messages,
            "temperature": self._settings.temperature,
            "max_tokens": self._settings.max_tokens,
        }
        try:
            response = await client.post(
                url, json=body, headers=self._headers(), timeout=self._settings.timeout_s
            )
        except httpx.HTTPError as e:
            raise JudgeUnavailable(f"judge endpoint {url} unreachable: {e!r}") from e
        if response.status_code // 100 != 2:
            raise JudgeUnavailable(
                f"judge endpoint {url} answered HTTP {response.status_code}: {response.text[:200]}"
            )
        try:
            content = response.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as e:
            raise JudgeResponseInvalid(
                f"judge endpoint {url} returned no chat-completions answer: {response.text[:200]}"
            ) from e
        if not isinstance(content, str):
            raise JudgeResponseInvalid(
                f"judge endpoint {url} returned non-text content: {content!r}"[:300]
            )
        return content

    async def judge(self, trajectory: Trajectory) -> Judgement:
        """Score one trajectory; an unparseable answer comes back with `parsed=False`.

        Raises:
            JudgeUnavailable: the endpoint could not be reached or answered non-2xx.
            JudgeResponseInvalid: the endpoint's body is not a chat-completions response.
        """
        messages = build_messages(trajectory, self._settings.max_observation_chars)
        started = time.perf_counter()
        if self._client is not None:
            answer = await self._complete(self._client, messages)
        else:
            async with httpx.AsyncClient() as client:
                answer = await self._complete(client, messages)
        latency_ms = (time.perf_counter() - started) * 1000.0
        common = {
            "episode_id": str(trajectory.episode_id),
            "judge": self.name,
            "raw_answer": answer,
            "latency_ms": latency_ms,
        }
        try:
            rubric = parse_answer(answer, trajectory.n_steps)
        except AnswerUnparseable as e:
            return Judgement(parsed=False, parse_error=str(e), rubric=None, **common)
        return Judgement(parsed=True, rubric=rubric, **common)

    async def judge_many(self, trajectories: Sequence[Trajectory]) -> list[Judgement]:
        """Judge several trajectories with at most `settings.concurrency` requests in flight."""
        semaphore = asyncio.Semaphore(self._settings.concurrency)

        async def one(client: httpx.AsyncClient, trajectory: Trajectory) -> Judgement:
            async with semaphore:
                judge = GrmJudge(self._settings, client)
                return await judge.judge(trajectory)

        if self._client is not None:
            return list(await asyncio.gather(*(one(self._client, t) for t in trajectories)))
        async with httpx.AsyncClient() as client:
            return list(await asyncio.gather(*(one(client, t) for t in trajectories)))
