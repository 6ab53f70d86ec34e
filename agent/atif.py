"""ATIF v1.0–v1.8 (Harbor's Agent Trajectory Interchange Format) as pydantic models.

Field names and shapes follow the ATIF RFC (laude-institute/harbor,
docs/rfcs/0001-trajectory-format.md) up to v1.8: v1.2 system-step observations, v1.3/v1.4
`completion_token_ids` / `prompt_token_ids`, v1.5 `agent.tool_definitions`, step
`is_copied_context` and root `continued_trajectory_ref`; v1.6 content parts (`text` and
`image`) for a step's `message` and an observation result's `content`; v1.7 root
`trajectory_id`, an optional (run-scoped) `session_id`, embedded `subagent_trajectories`,
sub-agent refs resolved by `trajectory_id` or `trajectory_path`, step `llm_call_count`;
v1.8 `audio` parts and no `tool_call_id` used twice in one trajectory. They are at least
as strict as Harbor's own models (`harbor.models.trajectories`): step ids run 1, 2, … in
order, every `source_call_id` names a call of its own step, agent-only fields appear on
agent steps only, timestamps are ISO 8601, an agent step with `llm_call_count` 0 has no
metrics or reasoning, a content part has exactly the field its type needs; and a feature
is refused in a document whose declared version predates it (content arrays before v1.6,
embedded sub-agents before v1.7, audio before v1.8). These models
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
    "ATIF_VERSIONS",
    "AtifAgent",
    "AtifAudioSource",
    "AtifContentPart",
    "AtifFinalMetrics",
    "AtifImageSource",
    "AtifMetrics",
    "AtifObservation",
    "AtifObservationResult",
    "AtifStep",
    "AtifSubagentRef",
    "AtifToolCall",
    "AtifTrajectory",
    "content_text",
]

ATIF_SCHEMA_VERSION = "ATIF-v1.5"
"""The ATIF version epiflow writes for the episodes it ran (an imported document exports
with the version it had; `to_atif(..., schema_version=...)` asks for another)."""
ATIF_VERSIONS = tuple(f"ATIF-v1.{minor}" for minor in range(9))
"""Every version epiflow reads, oldest first (the last is the newest)."""

_VERSION = re.compile(r"^ATIF-v1\.([0-8])$")
_IMAGE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp")
_AUDIO_TYPES = (
    "audio/wav",
    "audio/mpeg",
    "audio/mp4",
    "audio/aac",
    "audio/ogg",
    "audio/flac",
    "audio/webm",
    "audio/aiff",
)
_AUDIO_ALIASES = {
    "audio/mp3": "audio/mpeg",
    "audio/mpga": "audio/mpeg",
    "audio/x-mpeg": "audio/mpeg",
    "audio/x-wav": "audio/wav",
    "audio/wave": "audio/wav",
    "audio/vnd.wave": "audio/wav",
    "audio/x-m4a": "audio/mp4",
    "audio/m4a": "audio/mp4",
    "audio/x-aac": "audio/aac",
    "audio/x-flac": "audio/flac",
    "audio/x-aiff": "audio/aiff",
}
"""Spellings Harbor accepts for an audio type (kept as written; only the check normalises)."""
_AGENT_ONLY = ("model_name", "reasoning_effort", "reasoning_content", "tool_calls", "metrics")
"""Step fields Harbor allows on `agent` steps only."""


class AtifImageSource(BaseModel):
    """ATIF ImageSource (v1.6): an image by path or URL."""

    model_config = ConfigDict(extra="forbid")

    media_type: str
    """One of `image/jpeg`, `image/png`, `image/gif`, `image/webp`."""
    path: str
    """A relative or absolute file path, or a URL."""

    @field_validator("media_type")
    @classmethod
    def _image_type(cls, value: str) -> str:
        if value not in _IMAGE_TYPES:
            raise ValueError(
                f"{value!r} is not an image type ATIF allows ({', '.join(_IMAGE_TYPES)})"
            )
        return value


class AtifAudioSource(BaseModel):
    """ATIF AudioSource (v1.8): audio by path or URL."""

    model_config = ConfigDict(extra="forbid")

    media_type: str
    """An audio type (`audio/wav`, `audio/mpeg`, …; Harbor's aliases such as `audio/mp3`
    are accepted and kept as written)."""
    path: str
    """A relative or absolute file path, or a URL."""
    duration_sec: float | None = Field(default=None, ge=0)
    """Duration in seconds, when known."""

    @field_validator("media_type")
    @classmethod
    def _audio_type(cls, value: str) -> str:
        normal = value.strip().lower()
        if _AUDIO_ALIASES.get(normal, normal) not in _AUDIO_TYPES:
            raise ValueError(
                f"{value!r} is not an audio type ATIF allows ({', '.join(_AUDIO_TYPES)})"
            )
        return value


class AtifContentPart(BaseModel):
    """ATIF ContentPart (v1.6; `audio` v1.8): `text` carries `text`, a media part its
    `source` and no text."""

    model_config = ConfigDict(extra="forbid")

    type: Literal["text", "image", "audio"]
    """The kind of part."""
    text: str | None = None
    """The text of a `text` part."""
    source: AtifImageSource | AtifAudioSource | None = None
    """Where an `image` or `audio` part's media is."""

    @model_validator(mode="after")
    def _fields_of_its_type(self) -> AtifContentPart:
        if self.type == "text":
            if self.text is None:
                raise ValueError("a 'text' part needs 'text'")
            if self.source is not None:
                raise ValueError("a 'text' part has no 'source'")
        else:
            if self.source is None:
                raise ValueError(f"an {self.type!r} part needs 'source'")
            if self.text is not None:
                raise ValueError(f"an {self.type!r} part has no 'text'")
            kind = AtifImageSource if self.type == "image" else AtifAudioSource
            if not isinstance(self.source, kind):
                raise ValueError(
                    f"an {self.type!r} part needs an {self.type} source, "
                    f"got media_type {self.source.media_type!r}"
                )
        return self


Content = str | list[AtifContentPart]
"""A step's `message` or a result's `content`: a string, or (v1.6) a list of parts."""


def content_text(value: Content | None) -> str:
    """The text of a message or result content: the string, or the `text` parts joined by
    newlines (image and audio parts have none; they stay in the stored document)."""
    if value is None:
        return ""
    if isinstance(value, str):
        return value
    return "\n".join(p.text for p in value if p.type == "text" and p.text is not None)


class AtifSubagentRef(BaseModel):
    """ATIF SubagentTrajectoryRef: up to v1.6 by `session_id`; from v1.7 by
    `trajectory_id` (an embedded sub-agent) or `trajectory_path` (a file)."""

    model_config = ConfigDict(extra="forbid")

    session_id: str | None = None
    """The sub-agent's session (required up to v1.6; not a resolution key from v1.7)."""
    trajectory_id: str | None = None
    """The `trajectory_id` of a sub-agent in this document's `subagent_trajectories` (v1.7)."""
    trajectory_path: str | None = None
    """The sub-agent's own trajectory file."""
    extra: dict[str, Any] | None = None
    """Custom reference metadata."""


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
    content: Content | None = None
    """The observation: text, or (v1.6) a list of content parts."""
    subagent_trajectory_ref: list[AtifSubagentRef] | None = None
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
    message: Content
    """Prompt, user message or the assistant's raw text; or (v1.6) a list of content parts."""
    reasoning_content: str | None = None
    """Explicit reasoning of an agent step."""
    tool_calls: list[AtifToolCall] | None = None
    """The agent's calls."""
    observation: AtifObservation | None = None
    """Environment feedback (agent steps), or the result of a system operation (system steps)."""
    metrics: AtifMetrics | None = None
    """Token counts, costs, token ids and log probabilities."""
    llm_call_count: int | None = Field(default=None, ge=0)
    """LLM calls the step made (v1.7); 0 for an agent step that called no model, which then
    has no metrics and no reasoning."""
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
        if self.source == "agent" and self.llm_call_count == 0:
            for name in ("metrics", "reasoning_content"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name!r} is not allowed on an agent step with llm_call_count 0"
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
    """`ATIF-v1.0` … `ATIF-v1.8`."""
    session_id: str | None = None
    """Run id of the producer (epiflow: the episode id); several documents may share one.
    Required up to v1.6; optional and run-scoped from v1.7."""
    trajectory_id: str | None = None
    """This trajectory's own id (v1.7); what sub-agent refs resolve by."""
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
    subagent_trajectories: list[AtifTrajectory] | None = None
    """Sub-agent trajectories embedded in this document (v1.7), each with a unique
    `trajectory_id`."""
    extra: dict[str, Any] | None = Field(default=None)
    """Custom root metadata (`extra["epiflow"]`: the episode fields the ATIF core does not
    carry; `extra["context_management"]` (v1.7) is kept as written)."""

    @field_validator("schema_version")
    @classmethod
    def _known_version(cls, value: str) -> str:
        if not _VERSION.match(value):
            raise ValueError(f"{value!r} is not an ATIF version epiflow reads (ATIF-v1.0 … v1.8)")
        return value

    @property
    def minor(self) -> int:
        """The declared version's minor number (`ATIF-v1.7` → 7)."""
        return int(self.schema_version.rsplit(".", 1)[1])

    @model_validator(mode="after")
    def _features_of_its_version(self) -> AtifTrajectory:
        minor = self.minor
        if minor <= 6 and self.session_id is None:
            raise ValueError("session_id: required up to ATIF-v1.6")
        if self.subagent_trajectories is not None and minor < 7:
            raise ValueError(
                f"subagent_trajectories: embedded sub-agents need ATIF-v1.7 or later, "
                f"the document is {self.schema_version}"
            )
        for i, step in enumerate(self.steps):
            contents: list[tuple[str, Content | None]] = [(f"steps.{i}.message", step.message)]
            if step.observation is not None:
                contents += [
                    (f"steps.{i}.observation.results.{j}.content", r.content)
                    for j, r in enumerate(step.observation.results)
                ]
            for at, content in contents:
                if isinstance(content, list):
                    if minor < 6:
                        raise ValueError(
                            f"{at}: content parts need ATIF-v1.6 or later, "
                            f"the document is {self.schema_version}"
                        )
                    if minor < 8 and any(p.type == "audio" for p in content):
                        raise ValueError(
                            f"{at}: audio parts need ATIF-v1.8 or later, "
                            f"the document is {self.schema_version}"
                        )
        return self

    @model_validator(mode="after")
    def _subagent_refs_resolve(self) -> AtifTrajectory:
        embedded: set[str] = set()
        for k, child in enumerate(self.subagent_trajectories or []):
            if child.trajectory_id is None:
                raise ValueError(
                    f"subagent_trajectories.{k}.trajectory_id: required for an embedded sub-agent"
                )
            if child.trajectory_id in embedded:
                raise ValueError(
                    f"subagent_trajectories.{k}.trajectory_id: {child.trajectory_id!r} "
                    "is used by an earlier embedded sub-agent"
                )
            embedded.add(child.trajectory_id)
        for i, step in enumerate(self.steps):
            for j, result in enumerate(step.observation.results if step.observation else []):
                for r, ref in enumerate(result.subagent_trajectory_ref or []):
                    at = f"steps.{i}.observation.results.{j}.subagent_trajectory_ref.{r}"
                    if self.minor <= 6:
                        if ref.session_id is None:
                            raise ValueError(f"{at}.session_id: required up to ATIF-v1.6")
                    elif ref.trajectory_id is None and ref.trajectory_path is None:
                        raise ValueError(
                            f"{at}: set trajectory_id or trajectory_path "
                            "(session_id resolves nothing from ATIF-v1.7)"
                        )
                    elif ref.trajectory_path is None and ref.trajectory_id not in embedded:
                        raise ValueError(
                            f"{at}.trajectory_id: {ref.trajectory_id!r} names no embedded "
                            "sub-agent of this document"
                        )
        return self

    @model_validator(mode="after")
    def _call_ids_unique(self) -> AtifTrajectory:
        if self.minor < 8:
            return self
        seen: dict[str, int] = {}
        for i, step in enumerate(self.steps):
            for c, call in enumerate(step.tool_calls or []):
                if call.tool_call_id in seen:
                    raise ValueError(
                        f"steps.{i}.tool_calls.{c}.tool_call_id: {call.tool_call_id!r} is "
                        f"already the id of a call of step {seen[call.tool_call_id]} "
                        "(ATIF-v1.8 ids are unique in a trajectory)"
                    )
                seen[call.tool_call_id] = step.step_id
        return self

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
