"""`RunReport`: everything `epiflow report` shows about one collection run, as pure data.

`reports.gather` fills it from SQL and the object store; `reports.html` renders it.
Neither side needs the other: tests render hand-built reports, and the gathering is
checked without parsing HTML.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from pydantic import BaseModel, Field

from agent.trajectory import Trajectory, success_rate


class RunInfo(BaseModel):
    """The `collection_run` row."""

    run_id: uuid.UUID
    """Id of the collection run."""
    run_key: str
    """Its key."""
    suite: str | None = None
    """Suite collected from."""
    policy: str | None = None
    """Policy spec that produced the episodes."""
    status: str = "running"
    """`running`, `completed` or `failed`."""
    started_at: datetime | None = None
    """When the run started (UTC)."""
    ended_at: datetime | None = None
    """When the run ended (UTC); None while running."""
    parameters: dict[str, Any] = Field(default_factory=dict)
    """Flow parameters (tasks, rollouts, concurrency, …)."""
    fault_profile: dict[str, Any] = Field(default_factory=dict)
    """Fault-injection profile in force; empty when off."""


class StatusCount(BaseModel):
    """Episodes with one (status, failure category) pair."""

    status: str
    """How the episodes ended."""
    failure_category: str
    """Why they ended."""
    episodes: int
    """How many."""


class TemplateStats(BaseModel):
    """Outcome of one task template."""

    template: str
    """Template name."""
    episodes: int
    """Episodes of the template (infrastructure outcomes left out)."""
    successes: int
    """Those with status `success`."""

    @property
    def success_rate(self) -> float:
        """Successes / episodes."""
        return self.successes / self.episodes if self.episodes else 0.0


class ToolStats(BaseModel):
    """Calls of one tool and how many failed (non-zero exit, typed error, timeout, signal)."""

    tool: str
    """Tool name as parsed from the model's call."""
    calls: int
    """Parsed calls of the tool."""
    failed: int
    """Calls that failed."""

    @property
    def failure_rate(self) -> float:
        """Failed / calls."""
        return self.failed / self.calls if self.calls else 0.0


class QcRunInfo(BaseModel):
    """The latest `qc_run` over the collection run."""

    qc_run_id: uuid.UUID
    """Id of the gate run."""
    started_at: datetime
    """When the gate started (UTC)."""
    batch_passed: bool
    """True when every batch expectation held."""
    batch_failures: list[dict[str, Any]] = Field(default_factory=list)
    """Failed batch expectations with observed values."""
    n_episodes: int = 0
    """Episodes gated."""
    n_keep: int = 0
    """Kept at full weight."""
    n_downweight: int = 0
    """Kept with reduced weight."""
    n_discard: int = 0
    """Discarded."""
    mean_quality: float | None = None
    """Mean quality score."""
    suite_versions: dict[str, Any] = Field(default_factory=dict)
    """GX suite versions used."""


class QcVerdictInfo(BaseModel):
    """One episode's `qc_result` row."""

    verdict: str
    """keep, downweight or discard."""
    quality_score: float
    """Quality in [0, 1]."""
    reward_sign: int
    """+1 when the final reward is non-negative, -1 otherwise."""
    reasons: list[dict[str, Any]] = Field(default_factory=list)
    """Failed expectations: {expectation, category, action, message}."""


class DeductionInfo(BaseModel):
    """Points a judge took off one dimension, citing steps."""

    dimension: str
    """Rubric dimension."""
    points: float
    """Points deducted."""
    steps: list[int] = Field(default_factory=list)
    """0-based step indices the deduction is about."""
    reason: str = ""
    """The judge's one-line reason."""
    code: str = ""
    """Machine-readable finding (rule judge), empty otherwise."""


class JudgementInfo(BaseModel):
    """One `judgement` row of the gate run."""

    judge: str
    """`rule` or `grm:<policy spec>`."""
    judge_version: str
    """Rubric version."""
    parsed: bool = True
    """False when the judge's answer did not parse (no scores)."""
    parse_error: str | None = None
    """Why it did not parse."""
    scores: dict[str, float | None] = Field(default_factory=dict)
    """Dimension → score 0–5, in rubric order."""
    deductions: list[DeductionInfo] = Field(default_factory=list)
    """Every deduction."""
    suggestion: str | None = None
    """One-line suggestion."""


class EpisodeEntry(BaseModel):
    """One episode: its row, its trajectory from the object store, its gate outcome."""

    episode_id: uuid.UUID
    """Episode id."""
    task_id: str
    """Task instance."""
    template: str
    """Task template."""
    rollout_index: int = 0
    """Rollout of the task within the run."""
    status: str
    """How it ended."""
    failure_category: str
    """Why it ended."""
    failure_reason: str | None = None
    """Detail of a failure."""
    n_steps: int = 0
    """Steps."""
    total_reward: float | None = None
    """Sum of immediate rewards and the final reward."""
    verifier_score: float | None = None
    """Verifier score in [0, 1]."""
    duration_ms: float | None = None
    """Wall time of the episode, ms."""
    trajectory: Trajectory | None = None
    """The full trajectory; None when it could not be read (see `trajectory_error`)."""
    trajectory_error: str | None = None
    """Why the trajectory is missing (a storage error, or never stored)."""
    trajectory_key: str | None = None
    """Object-store key of the trajectory (None for a storage error)."""
    qc: QcVerdictInfo | None = None
    """Verdict of the latest gate run, when the run was gated."""
    judgements: list[JudgementInfo] = Field(default_factory=list)
    """Judgements of the latest gate run."""


class PageInfo(BaseModel):
    """One page of a large run's episodes (`reports.pages`)."""

    number: int
    """1-based page number."""
    file: str
    """File name of the page, beside the overview page."""
    first: int
    """Number (1-based, run-wide) of its first episode."""
    last: int
    """Number of its last episode."""
    by_status: dict[str, int] = Field(default_factory=dict)
    """Its episodes by status."""


class RunReport(BaseModel):
    """Everything the report page shows about one collection run."""

    run: RunInfo
    """The run."""
    generated_at: datetime
    """When the report was gathered (UTC)."""
    status_mix: list[StatusCount] = Field(default_factory=list)
    """Episodes by (status, failure category)."""
    templates: list[TemplateStats] = Field(default_factory=list)
    """Outcome per template, sorted by name."""
    tools: list[ToolStats] = Field(default_factory=list)
    """Calls and failures per tool, sorted by name."""
    rewards: list[float] = Field(default_factory=list)
    """Total reward of every episode that has one."""
    step_counts: list[int] = Field(default_factory=list)
    """Steps of every episode."""
    quality_scores: list[float] = Field(default_factory=list)
    """Quality score of every episode the latest gate run scored."""
    injected_faults: dict[str, int] = Field(default_factory=dict)
    """Steps that carried an injected fault, by fault kind."""
    perturbations: dict[str, int] = Field(default_factory=dict)
    """Steps a noisy policy perturbed, by perturbation."""
    qc: QcRunInfo | None = None
    """The latest gate run; None when the run was never gated."""
    episodes: list[EpisodeEntry] = Field(default_factory=list)
    """Every episode, in start order."""

    @property
    def n_episodes(self) -> int:
        """Episodes of the run."""
        return sum(c.episodes for c in self.status_mix)

    @property
    def n_steps(self) -> int:
        """Steps of the run."""
        return sum(self.step_counts)

    @property
    def by_status(self) -> dict[str, int]:
        """Episodes by status."""
        counts: dict[str, int] = {}
        for c in self.status_mix:
            counts[c.status] = counts.get(c.status, 0) + c.episodes
        return counts

    @property
    def by_failure_category(self) -> dict[str, int]:
        """Episodes by failure category."""
        counts: dict[str, int] = {}
        for c in self.status_mix:
            counts[c.failure_category] = counts.get(c.failure_category, 0) + c.episodes
        return counts

    @property
    def success_rate(self) -> float:
        """Successful episodes / episodes that are not infrastructure outcomes."""
        return success_rate(self.by_status)
