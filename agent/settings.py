"""Settings of the episode loop and the policies (pydantic-settings, env prefix `EPIFLOW_AGENT_`).

Built at the entry point (a flow, the CLI, a test) and passed down; nothing here is read
at import time.
"""

from __future__ import annotations

from typing import Self

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.prompt import PromptStyle

__all__ = ["LoopSettings", "NoisyRates", "PolicySettings", "SuccessSettings"]


class SuccessSettings(BaseSettings):
    """The one success rule: when a verifier score makes an episode a success.

    The loop's status, the final reward (`scoring.rewards.final_reward`), the rule judge's
    false-claim check and the QC feature `success` all ask `is_success`, so an episode's
    status and its reward cannot disagree at the threshold.
    """

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_SUCCESS_", frozen=True, extra="forbid")

    threshold: float = Field(default=1.0, gt=0, le=1)
    """Verifier score at or above which an episode is a success; above 0, so an episode
    whose verifier scored 0 or did not run never is."""

    def is_success(self, verifier_score: float | None) -> bool:
        """Whether this verifier score (None: the verifier did not run) is a success."""
        return verifier_score is not None and verifier_score >= self.threshold


class LoopSettings(BaseSettings):
    """Limits and caps of one episode (`agent.loop.run_episode`)."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_AGENT_LOOP_", extra="forbid")

    max_steps: int = Field(default=30, ge=1)
    """Assistant turns before the episode ends as `max_steps`."""
    max_consecutive_parse_failures: int = Field(default=5, ge=1)
    """Consecutive unparsable turns (errors or no block) that end the episode as `parse_failures`."""
    repeat_warn_after: int = Field(default=3, ge=2)
    """The Nth identical consecutive call (same tool and args) gets a repetition warning."""
    repeat_abort_after: int = Field(default=6, ge=2)
    """The Nth identical consecutive call is not run; the episode ends (category `max_steps`)."""
    max_output_chars: int = Field(default=65_536, ge=1024)
    """Cap on one model answer, characters; longer answers are cut and `raw_output_truncated` is set."""
    observation_max_chars: int = Field(default=8_192, ge=256)
    """Cap on stdout (and on stderr) inside one observation the model reads."""
    step_text_max_chars: int = Field(default=16_384, ge=256)
    """Cap on the decoded `stdout`/`stderr` stored on a step (full bytes go to the object store)."""
    policy_timeout_s: float = Field(default=600.0, gt=0)
    """Wall-clock limit of one policy request, retries included (→ `policy_error`)."""
    episode_timeout_s: float | None = Field(default=None, gt=0)
    """Wall-clock limit of the whole episode in the loop (→ `timeout`); the sandbox's hard
    timeout applies independently."""
    success: SuccessSettings = Field(default_factory=SuccessSettings)
    """When an episode that gave `<final>` is a success (`EPIFLOW_SUCCESS_THRESHOLD`)."""
    verify_after_limits: bool = True
    """Run the verifier also when the episode ended by max steps or parse failures (partial credit)."""

    @model_validator(mode="after")
    def _repetition_order(self) -> Self:
        if self.repeat_abort_after <= self.repeat_warn_after:
            raise ValueError(
                f"repeat_abort_after ({self.repeat_abort_after}) must be greater than "
                f"repeat_warn_after ({self.repeat_warn_after})"
            )
        return self


class NoisyRates(BaseSettings):
    """Per-step probability of each perturbation of `scripted:noisy` (each in [0, 1])."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_AGENT_NOISY_", extra="forbid")

    malformed: float = Field(default=0.08, ge=0, le=1)
    """A structurally broken block (unclosed tag, text inside the block, unknown tag…)."""
    unknown_tool: float = Field(default=0.05, ge=0, le=1)
    """A call to a tool that does not exist."""
    missing_arg: float = Field(default=0.05, ge=0, le=1)
    """A call without one of its required args."""
    mistyped_arg: float = Field(default=0.05, ge=0, le=1)
    """A call with a value that does not coerce to its schema type."""
    premature_final: float = Field(default=0.03, ge=0, le=1)
    """`<final>` before the reference solution is complete."""
    fabricated_claim: float = Field(default=0.04, ge=0, le=1)
    """The message claims a tool result it never got (writes its own `<tool_result>`)."""
    repeated_command: float = Field(default=0.05, ge=0, le=1)
    """The previous executed call again, verbatim (new id)."""
    skipped_step: float = Field(default=0.04, ge=0, le=1)
    """One reference call silently skipped."""


class PolicySettings(BaseSettings):
    """Defaults of the model-backed policies; a spec string's query overrides some of them."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_AGENT_POLICY_", extra="forbid")

    api_key: SecretStr | None = None
    """Bearer token for `openai:` endpoints (local servers usually need none)."""
    temperature: float = Field(default=0.0, ge=0)
    """Sampling temperature for `openai:` endpoints."""
    max_tokens: int = Field(default=1024, ge=1)
    """Completion token cap (`max_tokens` for endpoints, `max_new_tokens` for `hf:`)."""
    request_timeout_s: float = Field(default=120.0, gt=0)
    """Timeout of one HTTP request to an endpoint."""
    max_retries: int = Field(default=4, ge=0)
    """Retries on transport errors, timeouts, 408/409/425/429/5xx and 2xx bodies that are
    not a chat completion."""
    backoff_initial_s: float = Field(default=0.5, ge=0)
    """First retry delay; doubles each retry (a `Retry-After` header wins when larger)."""
    backoff_max_s: float = Field(default=20.0, ge=0)
    """Upper bound of one retry delay."""
    max_response_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """Cap on an endpoint's HTTP body; larger bodies are a `policy_error`."""
    hf_device: str = "cpu"
    """torch device for `hf:` checkpoints (`cpu`, `cuda`, `cuda:1`, …)."""
    native_tools: bool = False
    """Send `tools=[…]` and accept native `tool_calls` instead of the text protocol."""
    prompt_style: PromptStyle = PromptStyle.FULL
    """System prompt style an `openai:` endpoint is shown (`full` for any real model;
    `compact` for a checkpoint trained on it, whose training config the remote policy
    cannot read: the `hf:` policy reads it from the checkpoint instead)."""
    request_token_ids: bool = False
    """Ask an `openai:` endpoint for the prompt and completion token ids and the sampled
    tokens' logprobs (`logprobs`, and vLLM's `return_token_ids` and
    `return_tokens_as_token_ids`); off by default, as servers other than vLLM may refuse
    fields they do not know. What an endpoint returns is recorded either way."""
    outage_episodes: int = Field(default=8, ge=0)
    """Episodes in a row ending `endpoint_error` after which a collection starts no more:
    the endpoint is down, the rest of the plan would only burn retries (the run ends
    needing a re-run of its key). 0: never stop early."""
    preflight_timeout_s: float = Field(default=60.0, gt=0)
    """Deadline of preflight's 1-token completion to an `openai:` endpoint (a CPU server
    loading its model may need longer)."""
    noisy: NoisyRates = Field(default_factory=NoisyRates)
    """Perturbation rates of `scripted:noisy`."""
