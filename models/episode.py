"""`episode`: one agent episode's metadata. Steps are in `step`, the full trace in the object store."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, Index
from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, text_col, time_col


class Episode(SQLModel, table=True):
    """An episode: task, policy, versions, sandbox, faults, timings, outcome, rewards."""

    __tablename__ = "episode"
    __table_args__ = (
        Index("ix_episode_suite_template", "suite", "template"),
        Index("ix_episode_run_status", "run_id", "status"),
    )

    id: uuid.UUID = doc(
        "Deterministic id: uuid5 of (run key, task id, rollout index).", primary_key=True
    )
    run_id: uuid.UUID = fk(
        "Collection run the episode belongs to.", "collection_run.id", nullable=False
    )
    task_id: str = fk("Task instance the episode worked on.", "task.id", nullable=False)
    rollout_index: int = doc("Which rollout of the task within the run (0-based).", default=0)
    suite: str = doc("Suite of the task (denormalised for queries).")
    suite_version: str = doc("Suite version the task came from.")
    template: str = doc("Task template (denormalised for queries).")
    task_version: str = doc("Template version.")
    instance_seed: int = doc("Seed that generated the task instance.")
    policy_id: str = fk("Policy that produced the assistant turns.", "policy.id", nullable=False)
    policy_seed: int = doc("Seed the policy used.", default=0)
    protocol_version: str = doc("Tool-call protocol version spoken.")
    tool_versions: dict[str, Any] = json_col("Version of each tool offered, by tool name.")
    sandbox_spec_hash: str = doc("Stable hash of the sandbox spec.", index=True)
    fault_profile: dict[str, Any] = json_col("Fault-injection profile in force; empty when off.")
    fault_seed: int | None = doc(
        "Seed of the fault injector (replays inject the same faults).",
        default=None,
        sa_type=BigInteger,
    )
    started_at: datetime | None = time_col(
        "When the episode started (UTC); NULL for an imported episode whose file has no "
        "timestamp (never the import time).",
        nullable=True,
        index=True,
    )
    ended_at: datetime | None = time_col("When the episode ended (UTC).", nullable=True)
    duration_ms: float | None = doc("Wall time of the whole episode, milliseconds.", default=None)
    status: str = doc(
        "How it ended: success, failed, timeout, env_error, policy_error, storage_error, "
        "endpoint_error, aborted, imported (an imported file recorded no outcome: unknown).",
        index=True,
    )
    failure_category: str = doc(
        "Why it ended: success, verifier_failed, max_steps, timeout, parse_failures, env_error, "
        "policy_error, storage_error, endpoint_error, aborted, imported (unknown).",
        index=True,
    )
    failure_reason: str | None = text_col(
        "Detail of a failure (error message, verifier reason).", nullable=True
    )
    verifier_score: float | None = doc(
        "Verifier score in [0, 1]; NULL when it did not run.", default=None
    )
    verifier_reason: str | None = text_col("The verifier's short reason.", nullable=True)
    final_answer: str | None = text_col("Text of the agent's <final>, if any.", nullable=True)
    claimed_success: bool = doc(
        "True when the agent gave a <final> answer (it claimed to be done).", default=False
    )
    final_reward: float | None = doc(
        "Reward from the verifier outcome (+1 / partial / failure).", default=None
    )
    total_reward: float | None = doc("Sum of immediate rewards and the final reward.", default=None)
    n_steps: int = doc("Number of steps.", default=0)
    n_parse_errors: int = doc("Steps whose assistant text did not parse.", default=0)
    n_tool_errors: int = doc(
        "Tool calls that failed (non-zero exit, typed error, timeout).", default=0
    )
    n_injected_faults: int = doc("Steps that carried an injected fault.", default=0)
    prompt_tokens: int | None = doc(
        "Prompt tokens over the steps that reported them; NULL when no step did "
        "(scripted policies report none).",
        default=None,
    )
    completion_tokens: int | None = doc(
        "Completion tokens over the steps that reported them; NULL when no step did.",
        default=None,
    )
    cost_usd: float | None = doc(
        "Cost in USD over the steps that reported one (imported episodes); NULL when none did.",
        default=None,
    )
    agent_name: str = doc(
        "Agent system that produced the episode: `epiflow` for episodes collected here, the "
        "ATIF `agent.name` of an imported one (`openhands`, `terminus-2`, …).",
        default="epiflow",
        index=True,
        sa_column_kwargs={"server_default": "epiflow"},
    )
    agent_version: str = doc(
        "Version of that agent system (`1` for epiflow's loop).",
        default="1",
        sa_column_kwargs={"server_default": "1"},
    )
    trajectory_key: str | None = doc("Object-store key of the full trajectory JSON.", default=None)
    created_at: datetime = time_col(
        "When the episode's record was complete: its ended_at, else started_at (UTC); "
        "when the row was written only for an imported file that has no times."
    )
