"""`step`: one assistant turn, its parsed call, the observation, and its rewards."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import ColumnElement, Index, false, literal_column, text
from sqlmodel import SQLModel

from models.columns import doc, fk, json_col, text_col, time_col

_TIMED_CALLS = (
    "parse_kind = 'tool_call' AND tool IS NOT NULL AND duration_ms IS NOT NULL "
    "AND injected_fault_kind IS NULL"
)


class Step(SQLModel, table=True):
    """A step. Raw model text and the parsed call are stored separately (seed 000 §3.2)."""

    __tablename__ = "step"
    __table_args__ = (
        Index("ix_step_tool_exit", "tool", "exit_code"),
        # The tool calls alone, narrow: `tool_failure_rates` and the cookbook's
        # per-tool questions read this index instead of every step's text (PostgreSQL
        # reads it alone, with the columns included; SQLite keeps the partial index).
        Index(
            "ix_step_tool_calls",
            "tool",
            "duration_ms",
            postgresql_where=text("parse_kind = 'tool_call' AND tool IS NOT NULL"),
            sqlite_where=text("parse_kind = 'tool_call' AND tool IS NOT NULL"),
            postgresql_include=[
                "episode_id",
                "injected_fault_kind",
                "timed_out",
                "error_type",
                "signal",
                "exit_code",
            ],
        ),
        # The steps the noisy policy perturbed (a few percent): the cookbook's
        # perturbation question reads these instead of the whole table.
        Index(
            "ix_step_perturbations",
            "episode_id",
            postgresql_where=text("policy_perturbation IS NOT NULL"),
            sqlite_where=text("policy_perturbation IS NOT NULL"),
            postgresql_include=["policy_perturbation"],
        ),
        # Exactly the calls the cookbook's slowest-tools question ranks, in rank order.
        Index(
            "ix_step_tool_durations",
            "tool",
            "duration_ms",
            postgresql_where=text(_TIMED_CALLS),
            sqlite_where=text(_TIMED_CALLS),
        ),
    )

    episode_id: uuid.UUID = fk(
        "Episode the step belongs to.",
        "episode.id",
        nullable=False,
        primary_key=True,
        ondelete="CASCADE",
    )
    step_index: int = doc("0-based position in the episode.", primary_key=True)
    history_hash: str = doc(
        "sha256 of the chat history sent to the policy before this step.", index=True
    )
    started_at: datetime | None = time_col(
        "When the policy request was made (UTC); NULL for an imported step whose file gave "
        "no timestamp.",
        nullable=True,
    )
    raw_output: str = text_col("The model's text exactly as returned (NULs stripped, capped).")
    raw_output_truncated: bool = doc(
        "True when the model's answer exceeded the output cap.", default=False
    )
    prompt_tokens: int | None = doc(
        "Prompt tokens reported by the policy; NULL when it reports none.", default=None
    )
    completion_tokens: int | None = doc("Completion tokens reported by the policy.", default=None)
    cached_tokens: int | None = doc("Cached subset of prompt_tokens, when reported.", default=None)
    cost_usd: float | None = doc("Cost of the turn in USD, when reported.", default=None)
    reasoning_content: str | None = text_col(
        "The model's explicit reasoning for the turn, when returned apart from its answer "
        "(ATIF reasoning_content).",
        nullable=True,
    )
    generation_latency_ms: float | None = doc("Wall time of the policy request, ms.", default=None)
    native_tool_calls: list[Any] | None = json_col(
        "Raw OpenAI tool_calls JSON when the endpoint used native tool calling.", nullable=True
    )
    parse_kind: str = doc("tool_call, final, none or error.", index=True)
    parse_error: str | None = text_col(
        "Protocol error sent back to the model, if parsing failed.", nullable=True
    )
    parse_tolerances: list[Any] = json_col(
        "Lenient parsing rules applied (e.g. stripped_markdown_fence).", factory=list
    )
    parse_latency_ms: float | None = doc("Time spent parsing, ms.", default=None)
    call_id: str | None = doc("Tool call id as written by the model.", default=None)
    tool: str | None = doc("Tool name of the parsed call.", default=None)
    args: dict[str, Any] | None = json_col(
        "Arguments of the parsed call after schema coercion.", nullable=True
    )
    final_answer: str | None = text_col("Text of <final> on this step, if any.", nullable=True)
    parse_error_code: str | None = doc(
        "Protocol error code (unknown_tool, missing_arg, text_after_block, …), if parsing failed.",
        default=None,
        index=True,
    )
    finish_reason: str | None = doc(
        "The endpoint's finish reason (stop, length, tool_calls), when known.", default=None
    )
    endpoint_retries: int = doc(
        "Retries of the policy request before this answer (transport errors, timeouts, "
        "429/5xx, bodies that were not a chat completion); 0 for policies without an endpoint.",
        default=0,
    )
    response_model: str | None = doc(
        "Model name the endpoint reported in its answer, when it reported one.", default=None
    )
    repetition_warning: bool = doc(
        "True when the observation warned about a repeated identical call.", default=False
    )
    policy_perturbation: str | None = doc(
        "Perturbation a scripted:noisy policy injected into this turn, if any.", default=None
    )
    observation: str | None = text_col(
        "Rendered <tool_result>/<tool_error> fed back to the model.", nullable=True
    )
    exit_code: int | None = doc("Exit code of the tool's command.", default=None)
    signal: int | None = doc("Signal that killed the command, if any.", default=None)
    timed_out: bool = doc("True when the per-call timeout killed the command.", default=False)
    error_type: str | None = doc(
        "Typed tool failure (nonzero_exit, not_found, timeout, …; every value is listed in "
        "docs/trajectory-schema.md); NULL when the call succeeded or did not run.",
        default=None,
    )
    stdout: str = text_col(
        "Standard output, decoded, NUL-free, truncated; full bytes in the object store."
    )
    stderr: str = text_col(
        "Standard error, decoded, NUL-free, truncated; full bytes in the object store."
    )
    stdout_truncated: bool = doc(
        "True when stdout here is shorter than what the command wrote.", default=False
    )
    stderr_truncated: bool = doc(
        "True when stderr here is shorter than what the command wrote.", default=False
    )
    stdout_key: str | None = doc(
        "Object-store key of the raw stdout bytes, when kept.", default=None
    )
    stderr_key: str | None = doc(
        "Object-store key of the raw stderr bytes, when kept.", default=None
    )
    observation_key: str | None = doc(
        "Object-store key of the whole observation (UTF-8 text) when `observation` holds it "
        "cut (an imported step past the inline cap); NULL otherwise.",
        default=None,
    )
    duration_ms: float | None = doc("Wall time of the tool call in the sandbox, ms.", default=None)
    cpu_ms: float | None = doc("CPU time (user + system) of the tool call, ms.", default=None)
    max_rss_kib: int | None = doc("Peak resident memory of the tool call, KiB.", default=None)
    files_changed: list[Any] = json_col(
        "Workspace files changed: [{path, change, size, sha256}].", factory=list
    )
    injected_fault_kind: str | None = doc(
        "Kind of fault injected into this step, if any.", default=None, index=True
    )
    injected_fault: dict[str, Any] | None = json_col(
        "Parameters of the injected fault.", nullable=True
    )
    soft_timeout_warning: bool = doc(
        "True when the observation carried the soft-timeout warning.", default=False
    )
    immediate_reward: float = doc("Per-step shaping reward.", default=0.0)
    discounted_return: float = doc("Discounted return from this step to the end.", default=0.0)
    is_copied_context: bool = doc(
        "True for an imported ATIF step marked `is_copied_context` (v1.5): copied from an "
        "earlier trajectory for context; never a training target, and not counted in "
        "`episode_tree`'s tokens and cost (the earlier trajectory paid for it).",
        default=False,
        sa_column_kwargs={"server_default": false()},
    )


def tool_failed_sql(table: str = "step") -> str:
    """`agent.trajectory.Step.tool_failed` as portable SQL (SQLite and PostgreSQL) over the
    step columns of `table` (a table name or alias): true when the step made a tool call
    that timed out, carries a typed error, was killed by a signal or exited non-zero.

    The `tool_failure_rates` view states the same rule (migrations are frozen history);
    `tests/storage/test_tool_failed.py` checks the view, this expression and the Python
    property agree on every edge.
    """
    t = table
    return (
        f"({t}.parse_kind = 'tool_call' AND ({t}.timed_out OR {t}.error_type IS NOT NULL "
        f"OR {t}.signal IS NOT NULL OR ({t}.exit_code IS NOT NULL AND {t}.exit_code <> 0)))"
    )


def tool_failed() -> ColumnElement[bool]:
    """`tool_failed_sql()` as a SQLAlchemy column expression over the `step` table."""
    return literal_column(tool_failed_sql("step"))
