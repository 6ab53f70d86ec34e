"""ATIF v1.4 (Harbor's Agent Trajectory Interchange Format) as pydantic models.

Field names and shapes follow the ATIF RFC (laude-institute/harbor,
docs/rfcs/0001-trajectory-format.md). Only the parts epiflow writes are modelled
strictly; objects where other producers add fields (`metrics`, observation results)
accept extra keys so foreign files import. The conversion lives in `agent.export`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

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

ATIF_SCHEMA_VERSION = "ATIF-v1.4"
"""The ATIF version epiflow writes."""


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
    """ATIF ObservationResultSchema (subagent references are not used by epiflow)."""

    model_config = ConfigDict(extra="allow")

    source_call_id: str | None = None
    """The `tool_call_id` this result answers; None for a result not tied to a call."""
    content: str | None = None
    """The observation text."""


class AtifObservation(BaseModel):
    """ATIF ObservationSchema."""

    model_config = ConfigDict(extra="forbid")

    results: list[AtifObservationResult]
    """One result per tool call or action."""


class AtifMetrics(BaseModel):
    """ATIF MetricsSchema (the subset epiflow records, plus whatever an import carries)."""

    model_config = ConfigDict(extra="allow")

    prompt_tokens: int | None = None
    """Prompt tokens of the turn."""
    completion_tokens: int | None = None
    """Completion tokens of the turn."""
    cached_tokens: int | None = None
    """Cached subset of the prompt tokens."""
    cost_usd: float | None = None
    """Cost of the turn."""
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
    """Environment feedback."""
    metrics: AtifMetrics | None = None
    """Token counts and costs."""
    extra: dict[str, Any] | None = None
    """Custom step metadata (`extra["epiflow"]`: the full epiflow step)."""


class AtifAgent(BaseModel):
    """ATIF AgentSchema."""

    model_config = ConfigDict(extra="forbid")

    name: str
    """Agent system name."""
    version: str
    """Agent system version."""
    model_name: str | None = None
    """Default model (epiflow: the policy spec)."""
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
    """`ATIF-v1.x`."""
    session_id: str
    """Run id (epiflow: the episode id)."""
    agent: AtifAgent
    """Agent configuration."""
    steps: list[AtifStep]
    """The interaction history."""
    notes: str | None = None
    """Free-form notes."""
    final_metrics: AtifFinalMetrics | None = None
    """Aggregates."""
    extra: dict[str, Any] | None = Field(default=None)
    """Custom root metadata (`extra["epiflow"]`: the episode metadata)."""
