"""Trajectory types: one episode of an agent working a task, step by step.

Pure data (pydantic). The episode loop fills a `Trajectory` as it goes (seed 000 §4.2:
"one trace object through the whole loop, each stage fills its fields"); `storage/`
turns it into SQL rows and objects. Nothing here touches SQL, Prefect or the sandbox.

Episode ids are deterministic (`episode_id_for`): uuid5 of the run key, the task id and
the rollout index, so re-running a collection with the same run key resumes instead of
duplicating.
"""

from __future__ import annotations

import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping
from datetime import UTC, datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from sandbox.types import FileChange, InjectedFault, ResourceUsage

__all__ = [
    "INFRASTRUCTURE_STATUSES",
    "OUTCOMELESS_STATUSES",
    "UNKNOWN_OUTCOME_STATUSES",
    "AgentIdentity",
    "AtifRemainder",
    "ContextStep",
    "EpisodeStatus",
    "FailureCategory",
    "FileChange",
    "HistoryHash",
    "InjectedFault",
    "ParseKind",
    "ResourceUsage",
    "Step",
    "Trajectory",
    "episode_id_for",
    "history_hash",
    "success_rate",
    "utcnow",
]

#: Namespace for deterministic episode ids. Never change it: ids on disk depend on it.
EPISODE_NAMESPACE = uuid.UUID("6f1d7c0e-5b8a-4f63-9a1e-2c4d8e9b7a10")

PROTOCOL_VERSION = "1"


def utcnow() -> datetime:
    """Timezone-aware now; naive datetimes are rejected everywhere in epiflow."""
    return datetime.now(UTC)


def episode_id_for(run_key: str, task_id: str, rollout_index: int) -> uuid.UUID:
    """The deterministic id of rollout `rollout_index` of `task_id` in run `run_key`."""
    return uuid.uuid5(EPISODE_NAMESPACE, f"{run_key}\x1f{task_id}\x1f{rollout_index}")


def history_hash(messages: Iterable[Mapping[str, Any]]) -> str:
    """sha256 of the chat history as canonical JSON (dedup and similar-episode lookups)."""
    return HistoryHash(messages).hexdigest()


class HistoryHash:
    """`history_hash` of a growing chat history in linear time (the one spelling of it).

    The canonical JSON of a list is `[`, its items' canonical JSON joined by `,`, then
    `]`: so each message is encoded once, when it joins the history, and the digest of
    the history so far is a copy of the running hash plus the closing bracket. The
    episode loop hashes the history before every step this way instead of re-encoding
    every earlier turn (the system prompt included) each time.
    """

    def __init__(self, messages: Iterable[Mapping[str, Any]] = ()) -> None:
        self._hash = hashlib.sha256(b"[")
        self._empty = True
        self.extend(messages)

    def extend(self, messages: Iterable[Mapping[str, Any]]) -> None:
        """Add `messages` to the end of the history."""
        for message in messages:
            item = json.dumps(message, sort_keys=True, ensure_ascii=False, separators=(",", ":"))
            self._hash.update(
                (b"" if self._empty else b",") + item.encode("utf-8", "surrogatepass")
            )
            self._empty = False

    def hexdigest(self) -> str:
        """The `history_hash` of the history so far."""
        digest = self._hash.copy()
        digest.update(b"]")
        return digest.hexdigest()


class EpisodeStatus(StrEnum):
    """How an episode ended, coarsely. `failure_category` says why."""

    SUCCESS = "success"
    FAILED = "failed"
    TIMEOUT = "timeout"
    ENV_ERROR = "env_error"
    POLICY_ERROR = "policy_error"
    STORAGE_ERROR = "storage_error"
    ENDPOINT_ERROR = "endpoint_error"
    ABORTED = "aborted"
    IMPORTED = "imported"
    """An imported trajectory whose file recorded no outcome: unknown, neither a success nor
    a failure (never a default outcome)."""


INFRASTRUCTURE_STATUSES: frozenset[EpisodeStatus] = frozenset(
    {EpisodeStatus.ENV_ERROR, EpisodeStatus.STORAGE_ERROR, EpisodeStatus.ENDPOINT_ERROR}
)
"""Outcomes of a failed sandbox, object store or model endpoint: never the agent's. They get
no reward, stay out of success rates and training, QC discards them, and re-running the run
key redoes them. The one definition; everything that treats infrastructure apart reads it."""

OUTCOMELESS_STATUSES: frozenset[EpisodeStatus] = frozenset(
    {EpisodeStatus.ABORTED, EpisodeStatus.IMPORTED}
)
"""Outcomes that say nothing about whether the agent solved its task: an episode cut off
(`aborted`), or imported from a file that recorded no outcome (`imported`). Preference and
outcome-labelled training rows (DPO, KTO) and QC leave them out."""

UNKNOWN_OUTCOME_STATUSES: frozenset[EpisodeStatus] = frozenset({EpisodeStatus.IMPORTED})
"""Outcomes nobody recorded: success rates leave them out of the denominator, as they do
infrastructure outcomes."""


def success_rate(by_status: Mapping[str, int]) -> float:
    """Successes over the episodes that say something about the agent (infrastructure
    outcomes and unknown imported outcomes left out); 0.0 when there are none."""
    infra = {str(s) for s in INFRASTRUCTURE_STATUSES | UNKNOWN_OUTCOME_STATUSES}
    judged = sum(n for status, n in by_status.items() if status not in infra)
    return by_status.get(EpisodeStatus.SUCCESS.value, 0) / judged if judged else 0.0


class FailureCategory(StrEnum):
    """Why an episode ended; `success` for the good case (seed 000 §4.2 "failure reason")."""

    SUCCESS = "success"
    VERIFIER_FAILED = "verifier_failed"
    MAX_STEPS = "max_steps"
    TIMEOUT = "timeout"
    PARSE_FAILURES = "parse_failures"
    ENV_ERROR = "env_error"
    POLICY_ERROR = "policy_error"
    STORAGE_ERROR = "storage_error"
    ENDPOINT_ERROR = "endpoint_error"
    ABORTED = "aborted"
    IMPORTED = "imported"
    """The imported file recorded no outcome (with `EpisodeStatus.IMPORTED`)."""


class ParseKind(StrEnum):
    """What the protocol parser found in one assistant message."""

    TOOL_CALL = "tool_call"
    FINAL = "final"
    NONE = "none"
    ERROR = "error"


class AtifRemainder(BaseModel):
    """What an imported ATIF object had that epiflow's own fields do not reproduce.

    Export renders the object from epiflow's fields, then patches it: each pointer of
    `values` is set to the document's value, each pointer of `missing` removed. Pointers are
    JSON pointers (RFC 6901) into the object, e.g. `/observation/results/0/source_call_id`.
    So an imported document comes back exactly (`agent.atif_convert`); usually empty.
    """

    values: dict[str, Any] = Field(default_factory=dict)
    """Where the document differs from epiflow's rendering (or has what it never writes): pointer → the document's value."""
    missing: list[str] = Field(default_factory=list)
    """Pointers to what epiflow's rendering writes and the document did not have."""


def _copied(remainder: AtifRemainder | None) -> bool:
    return remainder is not None and remainder.values.get("/is_copied_context") is True


class AgentIdentity(BaseModel):
    """The agent system that produced an imported episode (ATIF `agent`)."""

    name: str
    """Agent system name, e.g. `openhands`, `terminus-2`."""
    version: str
    """Agent system version."""
    model_name: str | None = None
    """Default model of the episode, when the document names one."""
    tool_definitions: list[dict[str, Any]] | None = None
    """Tools the agent was offered, as OpenAI function definitions (ATIF v1.5)."""
    extra: dict[str, Any] | None = None
    """The agent's own configuration (`agent.extra`), as written."""


class ContextStep(BaseModel):
    """A non-agent turn of an imported episode, kept in its place: a system prompt, a system
    event, or a user message."""

    before_step: int
    """Index of the agent step it came before (the number of agent steps when it came last)."""
    source: str
    """`system` or `user`."""
    message: str
    """Its text."""
    atif_remainder: AtifRemainder | None = None
    """The ATIF step's other fields (timestamp, observation, extra, …), see `AtifRemainder`."""

    @property
    def is_copied_context(self) -> bool:
        """The ATIF step was marked `is_copied_context` (v1.5): copied from an earlier
        trajectory for context, never a training target."""
        return _copied(self.atif_remainder)


class Step(BaseModel):
    """One assistant turn and what came of it, with every record point of seed 000 §4.2."""

    index: int
    """0-based position of the step in the episode."""
    history_hash: str
    """sha256 of the chat history sent to the policy for this step (before the request)."""
    started_at: datetime | None = Field(default_factory=utcnow)
    """When the request to the policy was made (UTC); None for an imported step whose file gave no timestamp."""

    # after the response
    raw_output: str = ""
    """The model's text exactly as returned (capped at the loop's output cap)."""
    raw_output_truncated: bool = False
    """True when the model's answer exceeded the cap and `raw_output` holds a prefix."""
    prompt_tokens: int | None = None
    """Prompt tokens reported by the policy, when it reports them."""
    completion_tokens: int | None = None
    """Completion tokens reported by the policy, when it reports them."""
    cached_tokens: int | None = None
    """Cached subset of `prompt_tokens`, when reported."""
    cost_usd: float | None = None
    """Cost of the turn in USD, when reported."""
    reasoning_content: str | None = None
    """The model's explicit reasoning for this turn, when returned apart from its answer."""
    prompt_token_ids: list[int] | None = None
    """Token ids of the prompt sent for this turn, when recorded."""
    completion_token_ids: list[int] | None = None
    """Token ids of the answer, when recorded (aligned with `logprobs`)."""
    logprobs: list[float] | None = None
    """Log probability of each answer token, when recorded."""
    generation_latency_ms: float | None = None
    """Wall time of the policy request, milliseconds."""
    native_tool_calls: list[dict[str, Any]] | None = None
    """Raw OpenAI `tool_calls` JSON when the endpoint used native tool calling."""
    finish_reason: str | None = None
    """The policy's finish reason (`stop`, `length`, `tool_calls`…), when reported."""
    endpoint_retries: int = 0
    """Retries of the policy request before this answer (transport errors, timeouts, 429/5xx, bodies that were not a chat completion); 0 for policies without an endpoint."""
    response_model: str | None = None
    """Model name the endpoint reported in its answer, when it reported one."""
    policy_perturbation: str | None = None
    """Deliberate perturbation a scripted policy injected into this turn (`scripted:noisy`:
    `malformed`, `unknown_tool`, `missing_arg`, `mistyped_arg`, `premature_final`,
    `fabricated_claim`, `repeated_command`, `skipped_step`); None for a normal turn."""

    # after parsing
    parse_kind: ParseKind = ParseKind.NONE
    """What the parser found: a tool call, a final answer, nothing, or an error."""
    parse_error: str | None = None
    """The protocol error message sent back to the model, when parsing failed."""
    parse_error_code: str | None = None
    """Stable code of the protocol error (`unknown_tool`, `missing_arg`, … see docs/protocol.md)."""
    parse_tolerances: list[str] = Field(default_factory=list)
    """Lenient rules the parser applied (e.g. `stripped_markdown_fence`)."""
    parse_latency_ms: float | None = None
    """Time spent parsing, milliseconds."""
    call_id: str | None = None
    """The tool call's id as written by the model."""
    tool: str | None = None
    """Tool name of the parsed call."""
    args: dict[str, Any] | None = None
    """Arguments of the parsed call after schema coercion."""
    final_answer: str | None = None
    """Text of `<final>` when the model ended the episode."""

    # after execution
    observation: str | None = None
    """The rendered `<tool_result>`/`<tool_error>` text fed back to the model."""
    exit_code: int | None = None
    """Exit code of the tool's command; None when it did not run or was killed by a signal."""
    signal: int | None = None
    """Signal that killed the command, if any."""
    timed_out: bool = False
    """True when the per-call timeout killed the command."""
    error_type: str | None = None
    """Typed tool failure (e.g. `not_found`, `permission_denied`, `timeout`), if any."""
    stdout: str = ""
    """Standard output, decoded, NUL-free and truncated for SQL; full bytes in the object store."""
    stderr: str = ""
    """Standard error, decoded, NUL-free and truncated for SQL; full bytes in the object store."""
    stdout_truncated: bool = False
    """True when `stdout` is shorter than what the command wrote."""
    stderr_truncated: bool = False
    """True when `stderr` is shorter than what the command wrote."""
    stdout_bytes: bytes | None = Field(default=None, exclude=True)
    """Raw stdout bytes, kept in memory only until storage writes them as an object."""
    stderr_bytes: bytes | None = Field(default=None, exclude=True)
    """Raw stderr bytes, kept in memory only until storage writes them as an object."""
    observation_whole: str | None = Field(default=None, exclude=True)
    """The whole observation of an imported step whose `observation` is cut, kept in memory only until storage writes it as an object."""
    duration_ms: float | None = None
    """Wall time of the tool call inside the sandbox, milliseconds."""
    resources: ResourceUsage | None = None
    """rusage of the tool call."""
    files_changed: list[FileChange] = Field(default_factory=list)
    """Workspace files the call created, modified or deleted."""
    injected_fault: InjectedFault | None = None
    """The fault injected into this step, if any."""
    soft_timeout_warning: bool = False
    """True when the observation carried the soft-timeout warning."""
    repetition_warning: bool = False
    """True when the observation carried the repeated-call warning (see `repeat_count`)."""
    repeat_count: int = 0
    """How many identical consecutive calls (same tool and args) end with this one; 0 when no call."""

    # scoring (filled by scoring/ after the episode)
    immediate_reward: float = 0.0
    """Per-step shaping reward (format, repetition, exploration)."""
    return_: float = Field(default=0.0, alias="return")
    """Discounted return from this step to the end of the episode."""

    # imports
    atif_remainder: AtifRemainder | None = None
    """ATIF fields of an imported step that the fields above do not hold (per-step model, extra, observation layout, …); None for steps epiflow ran."""

    model_config = ConfigDict(
        populate_by_name=True, ser_json_bytes="base64", val_json_bytes="base64"
    )

    @property
    def is_copied_context(self) -> bool:
        """The imported ATIF step was marked `is_copied_context` (v1.5): copied from an
        earlier trajectory (after context summarisation) for context. It was trained on
        there, so the dataset builders never make it a training target here; the one
        definition (`step.is_copied_context` in SQL is written from it)."""
        return _copied(self.atif_remainder)

    @property
    def tool_failed(self) -> bool:
        """The step made a tool call and the call did not succeed: it timed out, carries a
        typed error (every call epiflow could not run does: `sandbox_crashed`,
        `unknown_tool`, an injected fault…), was killed by a signal, or exited non-zero.

        An exit code that is unknown (None) with none of those is not a failure: only
        imported trajectories whose tools reported no exit code look like that. This is the
        one definition; SQL states it as `models.step.tool_failed_sql` and a test keeps the
        two in agreement.
        """
        return self.parse_kind == ParseKind.TOOL_CALL and (
            self.timed_out
            or self.error_type is not None
            or self.signal is not None
            or (self.exit_code is not None and self.exit_code != 0)
        )


class Trajectory(BaseModel):
    """One episode: metadata plus its steps. The unit that is collected, stored and scored."""

    model_config = ConfigDict(populate_by_name=True)

    episode_id: uuid.UUID
    """Deterministic id, see `episode_id_for`."""
    run_key: str
    """The collection run's key; re-running the same key resumes."""
    task_id: str
    """Stable id of the task instance (template, seed, version)."""
    rollout_index: int = 0
    """Which rollout of this task instance within the run (0-based)."""
    suite: str
    """Suite the task came from."""
    suite_version: str
    """Version of that suite."""
    template: str
    """Task template name within the suite."""
    task_version: str = "1"
    """Version of the task template."""
    instance_seed: int = 0
    """Seed that generated the task instance."""
    difficulty: int | None = None
    """Difficulty of the task template, 1 (chore) … 5 (long job with traps)."""
    prompt: str = ""
    """The task as the agent saw it."""
    policy: str
    """Policy spec, e.g. `scripted:oracle`, `openai:http://…#model`, `hf:/path`, or `atif:<agent>@<version>#<model>` for an imported ATIF episode."""
    agent: AgentIdentity | None = None
    """The foreign agent that produced an imported episode; None when epiflow's loop ran it."""
    policy_seed: int = 0
    """Seed the policy used (perturbations, sampling)."""
    protocol_version: str = PROTOCOL_VERSION
    """Tool-call protocol version the episode spoke."""
    tool_versions: dict[str, str] = Field(default_factory=dict)
    """Version string of each tool offered, by tool name."""
    sandbox_spec_hash: str = ""
    """Stable hash of the sandbox spec the episode ran under."""
    fault_profile: dict[str, Any] = Field(default_factory=dict)
    """The fault-injection profile (probabilities and ranges) in force; empty when off."""
    fault_seed: int | None = None
    """Seed of the fault injector, so a replay injects the same faults."""
    started_at: datetime | None = Field(default_factory=utcnow)
    """When the episode started (UTC); None for an imported episode whose file has no timestamp (never the import time)."""
    ended_at: datetime | None = None
    """When the episode ended (UTC)."""
    status: EpisodeStatus = EpisodeStatus.ABORTED
    """How the episode ended (`imported`: an imported file recorded no outcome)."""
    failure_category: FailureCategory = FailureCategory.ABORTED
    """Why the episode ended (`success` when it succeeded, `imported` when unknown)."""
    failure_reason: str | None = None
    """Human-readable detail for a failure (error message, verifier reason)."""
    verifier_score: float | None = None
    """Verifier score in [0, 1]; None when the verifier did not run."""
    verifier_reason: str | None = None
    """The verifier's short reason."""
    verifier_details: dict[str, Any] | None = None
    """What the verifier reported beyond the score (a Harbor task's image, substitutions, reward keys and per-test results); None for the built-in verifiers."""
    final_answer: str | None = None
    """Text of the agent's `<final>`, if it gave one."""
    final_reward: float | None = None
    """Reward from the verifier outcome (+1 / partial / failure)."""
    total_reward: float | None = None
    """Sum of immediate rewards and the final reward."""
    context_steps: list[ContextStep] = Field(default_factory=list)
    """Non-agent turns of an imported episode in their places; empty for episodes epiflow ran (their system prompt is rendered from the tools)."""
    steps: list[Step] = Field(default_factory=list)
    """The steps, in order."""
    atif_remainder: AtifRemainder | None = None
    """Top-level ATIF fields of an imported document that epiflow does not hold (session id, notes, extra, …)."""

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def duration_ms(self) -> float | None:
        if self.ended_at is None or self.started_at is None:
            return None
        return (self.ended_at - self.started_at).total_seconds() * 1000.0

    @property
    def prompt_tokens(self) -> int:
        return sum(s.prompt_tokens or 0 for s in self.steps)

    @property
    def completion_tokens(self) -> int:
        return sum(s.completion_tokens or 0 for s in self.steps)
