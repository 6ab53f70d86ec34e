"""ATIF v1.5 (Harbor's Agent Trajectory Interchange Format) as pydantic models.

Field names and shapes follow the ATIF RFC (laude-institute/harbor,
docs/rfcs/0001-trajectory-format.md) up to v1.5: v1.2 system-step observations, v1.3/v1.4
`completion_token_ids` / `prompt_token_ids`, v1.5 `agent.tool_definitions`, step
`is_copied_context` and root `continued_trajectory_ref`. They are at least as strict as
Harbor's own models (`harbor.models.trajectories`): step ids run 1, 2, … in order, every
`source_call_id` names a call of its own step, agent-only fields appear on agent steps
only, timestamps are ISO 8601. These models
validate a document (every error carries its field path); the conversion to and from
`Trajectory` reads the validated document and keeps what epiflow has no field for
(`agent.atif_convert`). Objects where producers add provider data (`metrics`, observation
results) accept extra keys; every other object refuses unknown keys, so a misspelt field
is an error that names it instead of data silently dropped.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

__all__ = [
    "ATIF_SCHEMA_VERSION",
    "AtifAgent",
    "AtifFinalMetrics",
    "AtifMetrics",
    "AtifObservation",
    "AtifObservationResult",
    "AtifStep",
    "AtifToolCall",
    "AtifTrajectory",
]

ATIF_SCHEMA_VERSION = "ATIF-v1.5"
"""The ATIF version epiflow writes (and the newest it reads)."""

_VERSION = re.compile(r"^ATIF-v1\.([0-5])$")
_AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
"""Step fields Harbor allows on `agent` steps only."""


class AtifToolCall(BaseModel):
    """ATIF ToolCallSchema."""

    model_config = ConfigDict(extra="forbid")

    tool_call_id: str
    """Id correlating the call with its observation result."""
    function_name: str
    """Tool name."""
    arguments: dict[str, Any]
    """Arguments as a JSON object."""


class AtifObservationResult(BaseModel):
    """ATIF ObservationResultSchema."""

    model_config = ConfigDict(extra="allow")

    source_call_id: str | None = None
    """The `tool_call_id` this result answers; None for a result not tied to a call."""
    content: str | None = None
    """The observation text."""
    subagent_trajectory_ref: list[dict[str, Any]] | None = None
    """References to delegated subagent trajectories."""


class AtifObservation(BaseModel):
    """ATIF ObservationSchema."""

    model_config = ConfigDict(extra="forbid")

    results: list[AtifObservationResult]
    """One result per tool call or action."""


class AtifMetrics(BaseModel):
    """ATIF MetricsSchema (plus whatever provider data a producer adds)."""

    model_config = ConfigDict(extra="allow")

    prompt_tokens: int | None = None
    """Prompt tokens of the turn (cached ones included)."""
    completion_tokens: int | None = None
    """Completion tokens of the turn."""
    cached_tokens: int | None = None
    """Cached subset of the prompt tokens."""
    cost_usd: float | None = None
    """Cost of the turn."""
    prompt_token_ids: list[int] | None = None
    """Token ids of the prompt (v1.4)."""
    completion_token_ids: list[int] | None = None
    """Token ids of the completion (v1.3)."""
    logprobs: list[float] | None = None
    """Log probability of each completion token."""
    extra: dict[str, Any] | None = None
    """Provider-specific metrics."""


class AtifStep(BaseModel):
    """ATIF StepObject."""

    model_config = ConfigDict(extra="forbid")

    step_id: int
    """1-based ordinal."""
    timestamp: str | None = None
    """ISO 8601 time of the step."""
    source: Literal["system", "user", "agent"]
    """Who produced the step."""
    model_name: str | None = None
    """Model of an agent step."""
    reasoning_effort: str | float | None = None
    """Reasoning effort of an agent step."""
    message: str
    """Prompt, user message or the assistant's raw text."""
    reasoning_content: str | None = None
    """Explicit reasoning of an agent step."""
    tool_calls: list[AtifToolCall] | None = None
    """The agent's calls."""
    observation: AtifObservation | None = None
    """Environment feedback (agent steps), or the result of a system operation (system steps)."""
    metrics: AtifMetrics | None = None
    """Token counts, costs, token ids and log probabilities."""
    is_copied_context: bool | None = None
    """Copied from a previous trajectory for context (after summarisation, v1.5); such
    steps were trained on already and never become training targets."""
    extra: dict[str, Any] | None = None
    """Custom step metadata (`extra["epiflow"]`: epiflow's step fields the ATIF core does not carry)."""

    @field_validator("timestamp")
    @classmethod
    def _iso_timestamp(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                datetime.fromisoformat(value.replace("Z", "+00:00"))
            except ValueError as e:
                raise ValueError(f"not an ISO 8601 timestamp: {value!r}") from e
        return value

    @model_validator(mode="after")
    def _agent_only_fields(self) -> AtifStep:
        if self.source != "agent":
            for name in _AGENT_ONLY:
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name!r} is only allowed on agent steps, this step's source is "
                        f"{self.source!r}"
                    )
        return self


class AtifAgent(BaseModel):
    """ATIF AgentSchema."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Agent system name."""
    version: str
    """Agent system version."""
    model_name: str | None = None
    """Default model (epiflow: the policy spec)."""
    tool_definitions: list[dict[str, Any]] | None = None
    """Tools offered to the agent, as OpenAI function definitions (v1.5)."""
    extra: dict[str, Any] | None = None
    """Custom agent configuration."""


class AtifFinalMetrics(BaseModel):
    """ATIF FinalMetricsSchema."""

    model_config = ConfigDict(extra="forbid")

    total_prompt_tokens: int | None = None
    """Sum of prompt tokens."""
    total_completion_tokens: int | None = None
    """Sum of completion tokens."""
    total_cached_tokens: int | None = None
    """Sum of cached tokens."""
    total_cost_usd: float | None = None
    """Total cost."""
    total_steps: int | None = None
    """Number of steps."""
    extra: dict[str, Any] | None = None
    """Custom aggregates."""


class AtifTrajectory(BaseModel):
    """ATIF root object."""

    model_config = ConfigDict(extra="forbid")

    schema_version: str
    """`ATIF-v1.0` … `ATIF-v1.5`."""
    session_id: str
    """Run id of the producer (epiflow: the episode id); several documents may share one."""
    agent: AtifAgent
    """Agent configuration."""
    steps: list[AtifStep] = Field(min_length=1)
    """The interaction history."""
    notes: str | None = None
    """Free-form notes."""
    final_metrics: AtifFinalMetrics | None = None
    """Aggregates."""
    continued_trajectory_ref: str | None = None
    """The file that continues this trajectory (v1.5, e.g. after context summarisation)."""
    extra: dict[str, Any] | None = Field(default=None)
    """Custom root metadata (`extra["epiflow"]`: the episode fields the ATIF core does not carry)."""

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if not _VERSION.match(value):
            raise ValueError(f"{value!r} is not an ATIF version epiflow reads (ATIF-v1.0 … v1.5)")
        return value

    @model_validator(mode="after")
    def _step_ids_in_order(self) -> AtifTrajectory:
        for i, step in enumerate(self.steps):
            if step.step_id != i + 1:
                raise ValueError(
                    f"steps.{i}.step_id: expected {i + 1} (step ids run 1, 2, … in order), "
                    f"got {step.step_id}"
                )
        return self

    @model_validator(mode="after")
    def _call_references_resolve(self) -> AtifTrajectory:
        for i, step in enumerate(self.steps):
            if step.observation is None:
                continue
            ids = {c.tool_call_id for c in step.tool_calls or []}
            for j, result in enumerate(step.observation.results):
                if result.source_call_id is not None and result.source_call_id not in ids:
                    raise ValueError(
                        f"steps.{i}.observation.results.{j}.source_call_id: "
                        f"{result.source_call_id!r} names no tool call of step {step.step_id}"
                    )
        return self
