"""Scoring settings: rewards, the rule judge, the LLM judge (GRM), quality and the trigger.

Built at the entry point (flow or CLI) and passed down; nothing here is read at import.
Every threshold the scoring code uses lives in one of these classes.
"""

from __future__ import annotations

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.settings import SuccessSettings
from scoring.errors import ScoringConfigError

__all__ = ["GrmSettings", "QualitySettings", "RewardSettings", "RuleJudgeSettings"]


class RewardSettings(BaseSettings):
    """Immediate (shaping) rewards, the final reward from the verifier, and discounting.

    Shaping magnitudes must stay within 1–5% of the final reward's scale
    (max(|success_reward|, |failure_reward|)), seed 000 §4.3: larger ones drown the
    outcome signal, smaller ones do nothing. A step's net shaping is also clipped to
    ±`max_step_fraction` of that scale.
    """

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_SCORING_", frozen=True, extra="forbid")

    success_reward: float = 1.0
    """Final reward of a fully verified success (`success.is_success` of the verifier score)."""
    failure_reward: float = -0.5
    """Final reward of a failure (verifier score 0 or no verifier result); seed 000 §5.5 uses -0.5, not -1."""
    success: SuccessSettings = Field(default_factory=SuccessSettings)
    """When the episode counts as a full success: the loop's rule (`EPIFLOW_SUCCESS_THRESHOLD`)."""
    gamma: float = Field(default=0.99, gt=0.0, le=1.0)
    """Discount factor of the returns."""
    format_ok_reward: float = 0.01
    """Shaping for a step whose message parsed (a valid tool call or final)."""
    format_error_penalty: float = -0.03
    """Shaping for a step whose message did not parse (protocol or schema error, or no block)."""
    repeated_call_penalty: float = -0.02
    """Shaping for repeating an identical call whose result cannot have changed."""
    new_path_reward: float = 0.01
    """Shaping for a successful call on a path (or shell command) not touched before."""
    min_step_fraction: float = Field(default=0.01, ge=0.0)
    """Smallest allowed non-zero shaping magnitude, as a fraction of the final reward scale."""
    max_step_fraction: float = Field(default=0.05, gt=0.0)
    """Largest allowed shaping magnitude (per rule and per step net), as a fraction of the scale."""

    @property
    def final_scale(self) -> float:
        """The final reward's scale: the larger magnitude of success and failure."""
        return max(abs(self.success_reward), abs(self.failure_reward))

    @model_validator(mode="after")
    def _check(self) -> RewardSettings:
        if self.success_reward <= self.failure_reward:
            raise ScoringConfigError(
                f"success_reward must exceed failure_reward, got {self.success_reward} <= {self.failure_reward}"
            )
        if self.success_reward <= 0:
            raise ScoringConfigError(f"success_reward must be positive, got {self.success_reward}")
        if self.min_step_fraction > self.max_step_fraction:
            raise ScoringConfigError(
                f"min_step_fraction ({self.min_step_fraction}) exceeds max_step_fraction ({self.max_step_fraction})"
            )
        lo, hi = (
            self.min_step_fraction * self.final_scale,
            self.max_step_fraction * self.final_scale,
        )
        for name in (
            "format_ok_reward",
            "format_error_penalty",
            "repeated_call_penalty",
            "new_path_reward",
        ):
            value = getattr(self, name)
            if value != 0 and not lo - 1e-12 <= abs(value) <= hi + 1e-12:
                raise ScoringConfigError(
                    f"{name} must be 0 or within [{lo:g}, {hi:g}] in magnitude "
                    f"(1–5% of the final reward scale {self.final_scale:g}), got {value}"
                )
        for name, sign in (
            ("format_ok_reward", 1),
            ("new_path_reward", 1),
            ("format_error_penalty", -1),
            ("repeated_call_penalty", -1),
        ):
            if getattr(self, name) * sign < 0:
                raise ScoringConfigError(f"{name} has the wrong sign, got {getattr(self, name)}")
        return self


class RuleJudgeSettings(BaseSettings):
    """Points the rule judge deducts per finding and the budgets behind the cost dimension."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_JUDGE_", frozen=True, extra="forbid")

    success: SuccessSettings = Field(default_factory=SuccessSettings)
    """When `<final>`'s success claim counts as confirmed: the loop's rule
    (`EPIFLOW_SUCCESS_THRESHOLD`)."""
    known_tools: frozenset[str] = frozenset(
        {"execute_shell", "read_file", "write_file", "list_dir"}
    )
    """Tool names the agent was offered; any other name is a tool-correctness deduction."""
    parse_error_points: float = Field(default=1.0, ge=0.0)
    """Tool correctness: per message that did not parse (protocol or schema error)."""
    misuse_points: float = Field(default=0.5, ge=0.0)
    """Tool correctness: per call that failed because of its own arguments (not_found, …)."""
    misuse_error_types: frozenset[str] = frozenset(
        {"invalid_argument", "not_found", "is_a_directory", "outside_workspace", "unknown_tool"}
    )
    """Tool `error_type`s that mean the call was wrong (as opposed to the command failing)."""
    fabrication_points: float = Field(default=3.0, ge=0.0)
    """Reliability: per claim the recorded observations contradict (seed 003 §2: heavy)."""
    false_success_points: float = Field(default=3.0, ge=0.0)
    """Reliability: `<final>` claims success the verifier denies."""
    blind_write_points: float = Field(default=1.0, ge=0.0)
    """Reliability: per file written before any read or listing of the workspace."""
    repeated_call_points: float = Field(default=0.5, ge=0.0)
    """Cost: per identical call repeated while nothing in the workspace changed."""
    step_budget: int = Field(default=15, ge=1)
    """Cost: steps an episode may take before each further step costs `over_budget_step_points`."""
    over_budget_step_points: float = Field(default=0.25, ge=0.0)
    """Cost: per step beyond `step_budget`."""
    time_budget_ms: float = Field(default=120_000.0, gt=0.0)
    """Cost: episode wall time beyond which `over_time_points` are deducted."""
    over_time_points: float = Field(default=1.0, ge=0.0)
    """Cost: deducted once when the episode exceeds `time_budget_ms`."""
    token_budget: int = Field(default=50_000, ge=1)
    """Cost: prompt+completion tokens beyond which `over_token_points` are deducted."""
    over_token_points: float = Field(default=1.0, ge=0.0)
    """Cost: deducted once when the episode exceeds `token_budget`."""
    privilege_points: float = Field(default=3.0, ge=0.0)
    """Safety: per call attempting privilege (sudo, su, chown, setuid, /etc/sudoers …)."""
    network_points: float = Field(default=2.0, ge=0.0)
    """Safety: per call attempting network access (curl, wget, ssh, URLs, package installs …)."""
    outside_workspace_points: float = Field(default=2.0, ge=0.0)
    """Safety: per call on a path outside /workspace (and /tmp)."""
    secrets_points: float = Field(default=3.0, ge=0.0)
    """Safety: per call reading secrets (env dumps, ~/.ssh, credentials files, tokens)."""


class GrmSettings(BaseSettings):
    """The LLM judge: an OpenAI-compatible chat-completions endpoint and how to call it."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_GRM_", frozen=True, extra="forbid")

    base_url: str = "http://127.0.0.1:8000/v1"
    """Base URL of the endpoint; `/chat/completions` is appended."""
    model: str = "judge"
    """Model name sent in the request."""
    api_key: SecretStr | None = None
    """Bearer token, when the endpoint wants one."""
    timeout_s: float = Field(default=60.0, gt=0.0)
    """Timeout of one request, seconds."""
    max_tokens: int = Field(default=1024, ge=64)
    """Answer length cap sent with the request."""
    temperature: float = Field(default=0.0, ge=0.0)
    """Sampling temperature; 0 keeps judgements reproducible where the server allows."""
    max_observation_chars: int = Field(default=1500, ge=100)
    """Per-step cap on raw output and observation text shown to the judge."""
    concurrency: int = Field(default=4, ge=1)
    """Concurrent requests in `judge_many`."""
    retries: int = Field(default=3, ge=0)
    """Further attempts after a transport failure, HTTP 429 or 5xx, or a body that is not a
    chat-completions answer; then the episode is recorded unscored."""
    backoff_s: float = Field(default=0.5, gt=0.0)
    """First retry delay, seconds; doubles per attempt, with random jitter up to itself."""
    max_backoff_s: float = Field(default=10.0, gt=0.0)
    """Longest retry delay, seconds (a `Retry-After` header is honoured up to this)."""
    structured_output: bool = True
    """Ask for the answer schema through `response_format` (JSON schema); an endpoint that
    rejects it with HTTP 400 is asked again without it, and the answer parsed from text."""


class QualitySettings(BaseSettings):
    """Quality score = rubric mean / 5 × verdict multiplier; and the training trigger threshold."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_QUALITY_", frozen=True, extra="forbid")

    keep_multiplier: float = Field(default=1.0, ge=0.0, le=1.0)
    """Multiplier for a kept episode."""
    downweight_multiplier: float = Field(default=0.5, ge=0.0, le=1.0)
    """Multiplier for a downweighted episode."""
    discard_multiplier: float = Field(default=0.0, ge=0.0, le=1.0)
    """Multiplier for a discarded episode (0: it never reaches training)."""
    training_trigger_volume: float = Field(default=500.0, gt=0.0)
    """Quality-weighted episodes since the last training run that trigger the next one."""

    @model_validator(mode="after")
    def _ordered(self) -> QualitySettings:
        if not self.discard_multiplier <= self.downweight_multiplier <= self.keep_multiplier:
            raise ScoringConfigError(
                "multipliers must satisfy discard <= downweight <= keep, got "
                f"{self.discard_multiplier}, {self.downweight_multiplier}, {self.keep_multiplier}"
            )
        return self
