"""Quality-gate settings: which suite versions run, and how features are computed.

The pass/fail thresholds themselves live in the JSON suites (expectation kwargs); what
is here shapes the features those thresholds apply to.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent.trajectory import INFRASTRUCTURE_STATUSES
from scoring.settings import QualitySettings, RewardSettings, RuleJudgeSettings

__all__ = ["GateSettings", "QcConfig"]

SUITES_DIR = Path(__file__).resolve().parent / "suites"
"""Directory of the versioned suite files (`<name>_v<version>.json`)."""


class GateSettings(BaseSettings):
    """Gate configuration (env prefix `EPIFLOW_QC_`)."""

    model_config = SettingsConfigDict(env_prefix="EPIFLOW_QC_", frozen=True, extra="forbid")

    suites_dir: Path = SUITES_DIR
    """Where the suite JSON files are."""
    episode_suite_version: str = "1"
    """Version of the episode-level suite (`episode_v<version>.json`)."""
    batch_suite_version: str = "1"
    """Version of the batch-level suite (`batch_v<version>.json`)."""
    env_error_statuses: frozenset[str] = frozenset(str(s) for s in INFRASTRUCTURE_STATUSES)
    """Episode statuses that mean the infrastructure failed: the sandbox, the object store or
    the model endpoint (→ discard, counted in the batch rate)."""
    incomplete_statuses: frozenset[str] = frozenset({"policy_error", "aborted", "imported"})
    """Episode statuses with no outcome to learn from (→ discard, not counted as env errors);
    `imported`: an imported file that recorded no outcome."""
    env_error_types: frozenset[str] = frozenset(
        {
            "sandbox_error",
            "sandbox_crashed",
            "sandbox_unavailable",
            "executor_error",
            "internal_error",
        }
    )
    """Step `error_type`s that mean the sandbox itself broke, whatever the episode status."""
    outlier_min_group: int = Field(default=8, ge=2)
    """Episodes of one template needed before step/time outliers are judged (fewer: no verdict)."""
    steps_mad_floor: float = Field(default=2.0, gt=0.0)
    """Floor of the scaled MAD of step counts, so identical step counts do not make every deviation an outlier."""
    duration_mad_floor_ms: float = Field(default=5_000.0, gt=0.0)
    """Floor of the scaled MAD of episode wall time, milliseconds."""


class QcConfig(BaseModel):
    """Everything the gate needs, built once at the entry point
    (`config.settings.load_qc_config` reads it from the environment)."""

    model_config = ConfigDict(frozen=True)

    gate: GateSettings
    """Suite versions and feature settings."""
    rewards: RewardSettings
    """Final-reward formula (the result expectation checks its sign)."""
    judge: RuleJudgeSettings
    """Rule-judge points and budgets."""
    quality: QualitySettings
    """Quality multipliers and the training trigger threshold."""
