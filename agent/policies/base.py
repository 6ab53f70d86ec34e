"""The one async interface every policy implements, and what goes in and out of it."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from agent.prompt import render_system_prompt
from agent.trajectory import Step
from sandbox.tool_specs import ToolSpec
from tasks.types import TaskInstance

__all__ = ["Policy", "PolicyRequest", "PolicyResponse"]


class PolicyRequest(BaseModel):
    """Everything a policy may look at to produce the next assistant message."""

    model_config = ConfigDict(arbitrary_types_allowed=True)

    task: TaskInstance
    """The task (scripted policies read its reference solution; models only see `messages`)."""
    messages: list[dict[str, Any]]
    """The chat history in OpenAI message shape: system, user task, then turns and observations."""
    tools: list[ToolSpec]
    """The tools offered this episode."""
    steps: list[Step] = Field(default_factory=list)
    """The episode's steps so far (read-only; scripted policies derive their position from them)."""
    step_index: int = 0
    """Index of the step being requested."""
    seed: int = 0
    """The episode's policy seed (perturbations, sampling)."""


class PolicyResponse(BaseModel):
    """One assistant message and what it cost."""

    text: str
    """The assistant's text, exactly as produced (the loop caps it)."""
    native_tool_calls: list[dict[str, Any]] | None = None
    """Raw OpenAI `tool_calls` when the endpoint answered with native function calls."""
    prompt_tokens: int | None = None
    """Prompt tokens, when known."""
    completion_tokens: int | None = None
    """Completion tokens, when known."""
    latency_ms: float | None = None
    """Wall time of the request as the policy measured it (the loop measures too)."""
    finish_reason: str | None = None
    """The endpoint's finish reason (`stop`, `length`, `tool_calls`…), when known."""
    perturbation: str | None = None
    """Kind of deliberate perturbation a scripted policy injected into this message."""
    model: str | None = None
    """Model name as reported by the endpoint, when known."""
    retries: int = 0
    """Requests retried before this answer (an endpoint's transport errors, timeouts,
    429/5xx, bodies that were not a chat completion)."""
    prompt_token_ids: list[int] | None = None
    """Token ids of the prompt exactly as the model received them, when the policy knows them."""
    completion_token_ids: list[int] | None = None
    """Token ids the model sampled, in order (its end-of-turn token included when it
    sampled one), when the policy knows them; never a re-encoding of `text`."""
    logprobs: list[float] | None = None
    """Log probability of each sampled token, aligned with `completion_token_ids`."""
    token_prefix_break: str | None = None
    """Why this turn's `prompt_token_ids` do not extend the previous turn's prompt and
    completion ids (the policy encoded a full render instead); None when they do, on a
    first turn, or when the policy records no ids."""


class Policy(ABC):
    """Produces assistant messages. Stateless across calls: all state is in the request.

    One instance may serve many concurrent episodes; `aclose` releases shared resources
    (HTTP clients, loaded models).
    """

    spec: str
    """The spec string this policy was made from (recorded on the trajectory)."""

    replays_reference: bool = False
    """True for the task's reference solution replayed as written (`scripted:oracle`): its
    failure judges the environment, never an agent (`agent/substituted_base.py`)."""

    endpoint: str | None = None
    """Base URL of the model endpoint the policy calls; None for in-process policies. A
    policy with an endpoint that does not answer in time ends the episode `endpoint_error`
    (infrastructure), and preflight probes it."""

    @abstractmethod
    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        """The next assistant message.

        Raises:
            EndpointError: the model endpoint failed (down, overloaded, garbage after
                the retries); the episode ends as `endpoint_error`.
            PolicyError: the policy could not answer otherwise (a refused request, a
                load failure); the episode ends as `policy_error`.
        """

    def system_prompt(self, tools: Iterable[ToolSpec]) -> str:
        """The system prompt the episode loop shows this policy (default: the full prompt).

        A policy trained on another prompt style (a small local checkpoint trained on the
        compact prompt) returns that style, so what the loop records is what the model saw.
        """
        return render_system_prompt(tools)

    async def probe(self, *, deadline_s: float) -> str | None:
        """Check, before a run, that the policy can answer at all; returns what answered
        (the endpoint's model) or None when there is nothing to check (in-process
        policies).

        Raises:
            EndpointError: the endpoint gave no answer within `deadline_s` (the message
                names the URL).
        """
        return None

    async def aclose(self) -> None:
        """Release resources. Safe to call twice."""
        return None
