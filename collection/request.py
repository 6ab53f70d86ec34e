"""What to collect (`CollectRequest`, validated once) and what a collection did (`CollectResult`).

The request is the `collect-episodes` flow's parameter, so the Prefect UI renders it as a
form; the CLI, the flows, the demo and the benchmarks all build one and hand it to the
same lifecycle (`collection.lifecycle.open_collection`).
"""

from __future__ import annotations

import json
import uuid
from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from collection.errors import RequestError
from sandbox.faults import FaultProfile
from sandbox.spec import SandboxSpec

FAULT_PROFILES: dict[str, FaultProfile] = {
    "none": FaultProfile(),
    # Seed 000 §3.4: a little controlled noise teaches recovery; too much teaches timidity.
    "light": FaultProfile(
        latency_p=0.05, permission_denied_p=0.02, network_failure_p=0.02, tool_timeout_p=0.01
    ),
    "heavy": FaultProfile(
        latency_p=0.15, permission_denied_p=0.08, network_failure_p=0.08, tool_timeout_p=0.04
    ),
}
"""Named fault profiles for `faults`; a JSON object with `FaultProfile` fields works too."""

FaultPreset = Literal["none", "light", "heavy"]
"""The names of `FAULT_PROFILES` (a dropdown in the Prefect run form)."""
assert set(get_args(FaultPreset)) == set(FAULT_PROFILES)


class PolicyPreset(StrEnum):
    """Policies that need no endpoint or checkpoint (the run form's dropdown)."""

    ORACLE = "scripted:oracle"
    """Solves every task (the verifier's reference actions)."""
    NOISY = "scripted:noisy"
    """The oracle with protocol errors, fabricated claims and repeated commands mixed in."""
    IDLE = "scripted:idle"
    """Answers without calling tools (a negative control)."""


def fault_profile_of(value: str | FaultProfile | None) -> FaultProfile | None:
    """The profile `value` names (`none`, `light`, `heavy`), spells as JSON or is; None
    when off.

    Raises:
        ValueError: an unknown name or invalid JSON (the message says which).
    """
    if value is None:
        return None
    if isinstance(value, FaultProfile):
        profile = value
    elif value.strip().startswith("{"):
        try:
            profile = FaultProfile.model_validate_json(value)
        except ValidationError as e:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in err['loc']) or 'profile'}: {err['msg']}"
                for err in e.errors()
            )
            raise ValueError(f"invalid fault profile JSON: {problems}") from e
    elif value in FAULT_PROFILES:
        profile = FAULT_PROFILES[value]
    else:
        names = ", ".join(FAULT_PROFILES)
        raise ValueError(f"unknown fault profile {value!r} (use one of {names}, or JSON)")
    return profile if profile.enabled else None


class CollectRequest(BaseModel):
    """What to collect. Validated once, where it is built; every field is documented for
    the Prefect run form."""

    # Attribute docstrings become the JSON schema's descriptions: the run form's help text.
    model_config = ConfigDict(extra="forbid", frozen=True, use_attribute_docstrings=True)

    suite: str = "builtin"
    """Suite name (built-in or a user suite on EPIFLOW_SUITES_PATH)."""
    policy: Annotated[PolicyPreset, Field(title="preset")] | Annotated[str, Field(title="spec")] = (
        PolicyPreset.ORACLE
    )
    """Policy: a preset, or a spec such as scripted:noisy?malformed=0.3,
    openai:URL#MODEL (an OpenAI-compatible endpoint), hf:DIR or hf:checkpoint/ID."""
    tasks: int = Field(default=1, ge=1)
    """Task instances per template."""
    rollouts: int = Field(default=1, ge=1)
    """Rollouts per task instance."""
    concurrency: int = Field(default=4, ge=1, le=512)
    """Episodes running at once."""
    faults: (
        Annotated[FaultPreset, Field(title="preset")]
        | Annotated[FaultProfile, Field(title="probabilities")]
        | None
    ) = None
    """Fault injection: a preset (none, light, heavy) or probabilities per fault; empty is off."""
    sandbox_spec: SandboxSpec = Field(default_factory=SandboxSpec)
    """Sandbox of every episode (limits, network, timeouts)."""
    run_key: str | None = None
    """Key of the run; re-running a key completes only what is missing. Empty: the entry
    point picks one (the CLI a fresh key, a scheduled run one per night)."""
    seed: int = Field(default=0, ge=0)
    """First instance seed (instances use seed … seed+tasks-1)."""
    templates: list[str] | None = None
    """Restrict to these templates (default: all of the suite)."""
    batch_size: int = Field(default=16, ge=1)
    """Finished episodes persisted per transaction."""
    heldout: bool = False
    """Use the suite's held-out seeds (evaluation) instead of training seeds."""

    @field_validator("faults", mode="before")
    @classmethod
    def _known_faults(cls, value: Any) -> Any:
        """A name is checked, a JSON string (the CLI's `--faults '{...}'`) parsed."""
        if isinstance(value, str):
            if value.strip().startswith("{"):
                return fault_profile_of(value) or FaultProfile()
            fault_profile_of(value)
        return value

    @field_validator("policy")
    @classmethod
    def _policy_spec(cls, value: str) -> str:
        if not value.strip():
            raise ValueError("must not be blank")
        return value

    @field_validator("run_key")
    @classmethod
    def _usable_key(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():
            raise ValueError("must not be blank")
        return value

    @property
    def fault_profile(self) -> FaultProfile | None:
        """The fault profile in force; None when off."""
        return fault_profile_of(self.faults)

    def keyed(self, run_key: str) -> CollectRequest:
        """This request with its run key set."""
        return self.model_copy(update={"run_key": run_key})

    def run_parameters(self) -> dict[str, Any]:
        """The request as recorded on the `collection_run` row (JSON, spec apart)."""
        return dict(json.loads(self.model_dump_json(exclude={"sandbox_spec"})))

    @classmethod
    def from_options(cls, **options: Any) -> CollectRequest:
        """A request from CLI or flow options.

        Raises:
            RequestError: an option is invalid; the message lists every one with its reason.
        """
        try:
            return cls.model_validate(options)
        except ValidationError as e:
            problems = [
                (
                    "--" + "-".join(str(p) for p in err["loc"]).replace("_", "-"),
                    err["msg"].removeprefix("Value error, "),
                )
                for err in e.errors()
            ]
            raise RequestError(
                "; ".join(f"{option}: {message}" for option, message in problems),
                setting=problems[0][0],
            ) from e


def fresh_run_key(request: CollectRequest, token: uuid.UUID | None = None) -> str:
    """A new key for a manual run: `<suite>-<policy>-<8 hex>`, never shared with another run.

    With `token` (a flow run's id) the key is that flow run's own: a retry or a crash
    recovery of the same flow run resumes it."""
    return f"{request.suite}-{_slug(request.policy)}-{(token or uuid.uuid4()).hex[:8]}"


def nightly_run_key(request: CollectRequest, scheduled: datetime) -> str:
    """The key of a scheduled run: one per night, so re-running a crashed night resumes it."""
    return f"{request.suite}-{_slug(request.policy)}-{scheduled:%Y%m%d}"


def _slug(policy: str) -> str:
    return "".join(c if c.isalnum() or c in "._" else "-" for c in policy)[:60]


class CollectResult(BaseModel):
    """What a collection did (the CLI's JSON, the flow's result)."""

    run_id: uuid.UUID
    """Id of the collection run row."""
    run_key: str
    """Its key."""
    planned: int
    """Episodes in the plan (every shard of the request)."""
    episodes: int
    """Episodes of this run now in the database (resumed ones included)."""
    executed: int
    """Episodes this call ran (the rest were already there)."""
    steps: int
    """Steps of the run's stored episodes (resumed ones and every shard's included)."""
    executed_steps: int = 0
    """Steps written by this call."""
    by_status: dict[str, int]
    """Episodes of the run by status."""
    success_rate: float
    """Successful episodes / episodes of the run."""
    duration_s: float
    """Wall time of this call."""
