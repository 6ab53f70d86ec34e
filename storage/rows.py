"""Trajectory → SQL row dicts (pure: no session). Text is cleaned for PostgreSQL on the way.

JSON columns go through a `json` finisher: `clean_json` (the default) keeps them Python
values with their text cleaned, for SQLAlchemy and exports; the PostgreSQL COPY path
passes `json_text`, which cleans and serializes them in one step (`storage.sanitize`).
"""

from __future__ import annotations

import functools
import uuid
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from agent.atif_convert import AGENT_NAME, AGENT_VERSION
from agent.trajectory import EpisodeStatus, ParseKind, Trajectory, utcnow
from agent.trajectory import Step as StepData
from models import run_id_for
from storage.sanitize import clean_json, clean_text
from storage.sanitize import json_text as _json_text

JsonFinisher = Callable[[Any], Any]
"""Turns a JSON column's value into what the writer takes (`clean_json` or `json_text`)."""

#: A uuid5 (sha1) per row adds up over a batch; a run's episodes share one key.
run_id_of = functools.lru_cache(maxsize=1024)(run_id_for)


def policy_kind(spec: str) -> str:
    """`scripted:oracle` → `scripted`; `atif:openhands@1.0.0` → `atif`; a spec without a
    family prefix (an OpenAI-messages import's `imported`) is its own kind."""
    return spec.split(":", 1)[0] if ":" in spec else spec


def reported_total(values: Iterable[int | float | None]) -> Any:
    """Sum of the values reported; None when none was (not 0: 0 is a report)."""
    reported = [v for v in values if v is not None]
    return sum(reported) if reported else None


def recorded_at(t: Trajectory) -> datetime:
    """When `t`'s record was complete, for the `created_at` columns: its end, else its
    start, else (an imported file with no times) when its rows are built."""
    return t.ended_at or t.started_at or utcnow()


def task_row(t: Trajectory) -> dict[str, Any]:
    return {
        "id": t.task_id,
        "suite": t.suite,
        "suite_version": t.suite_version,
        "template": t.template,
        "template_version": t.task_version,
        "seed": t.instance_seed,
        "difficulty": t.difficulty,
        "prompt": clean_text(t.prompt),
        "created_at": t.started_at or recorded_at(t),
    }


def policy_row(t: Trajectory, *, json: JsonFinisher = clean_json) -> dict[str, Any]:
    config: dict[str, Any] = {}
    if t.agent is not None:
        config = {
            "agent_name": t.agent.name,
            "agent_version": t.agent.version,
            "model_name": t.agent.model_name,
        }
    return {
        "id": t.policy,
        "kind": policy_kind(t.policy),
        "config": json(config),
        "checkpoint_id": None,
        "created_at": t.started_at or recorded_at(t),
    }


def collection_run_row(
    *,
    run_key: str,
    suite: str,
    policy: str,
    parameters: dict[str, Any],
    sandbox_spec: dict[str, Any],
    fault_profile: dict[str, Any],
    started_at: datetime,
    json: JsonFinisher = clean_json,
) -> dict[str, Any]:
    """The `collection_run` row of a run that starts now (status `running`): the one
    builder, for a collection opening its run (`storage.runs.open_run`) and for episodes
    whose run has no row yet (ingest, imports: `run_row`)."""
    return {
        "id": run_id_of(run_key),
        "run_key": run_key,
        "suite": suite,
        "policy_id": policy,
        "parameters": json(parameters),
        "sandbox_spec": json(sandbox_spec),
        "fault_profile": json(fault_profile),
        "status": "running",
        "prefect_flow_run_id": None,
        "started_at": started_at,
        "ended_at": None,
    }


def run_row(t: Trajectory, *, json: JsonFinisher = clean_json) -> dict[str, Any]:
    """The `collection_run` row a trajectory implies when its run has none."""
    return collection_run_row(
        run_key=t.run_key,
        suite=t.suite,
        policy=t.policy,
        parameters={},
        sandbox_spec={},
        fault_profile=t.fault_profile,
        started_at=t.started_at or recorded_at(t),
        json=json,
    )


def episode_row(
    t: Trajectory, *, trajectory_key: str | None, json: JsonFinisher = clean_json
) -> dict[str, Any]:
    return {
        "id": t.episode_id,
        "run_id": run_id_of(t.run_key),
        "task_id": t.task_id,
        "rollout_index": t.rollout_index,
        "suite": t.suite,
        "suite_version": t.suite_version,
        "template": t.template,
        "task_version": t.task_version,
        "instance_seed": t.instance_seed,
        "policy_id": t.policy,
        "policy_seed": t.policy_seed,
        "protocol_version": t.protocol_version,
        "tool_versions": json(t.tool_versions),
        "sandbox_spec_hash": t.sandbox_spec_hash,
        "fault_profile": json(t.fault_profile),
        "fault_seed": t.fault_seed,
        "started_at": t.started_at,
        "ended_at": t.ended_at,
        "duration_ms": t.duration_ms,
        "status": str(t.status),
        "failure_category": str(t.failure_category),
        "failure_reason": clean_text(t.failure_reason) if t.failure_reason else None,
        "verifier_score": t.verifier_score,
        "verifier_reason": clean_text(t.verifier_reason) if t.verifier_reason else None,
        "final_answer": clean_text(t.final_answer) if t.final_answer is not None else None,
        "claimed_success": t.final_answer is not None,
        "final_reward": t.final_reward,
        "total_reward": t.total_reward,
        "n_steps": len(t.steps),
        "n_parse_errors": sum(1 for s in t.steps if s.parse_kind == ParseKind.ERROR),
        "n_tool_errors": sum(1 for s in t.steps if s.tool_failed),
        "n_injected_faults": sum(1 for s in t.steps if s.injected_fault is not None),
        "prompt_tokens": reported_total(s.prompt_tokens for s in t.steps),
        "completion_tokens": reported_total(s.completion_tokens for s in t.steps),
        "cost_usd": reported_total(s.cost_usd for s in t.steps),
        "agent_name": clean_text(t.agent.name) if t.agent is not None else AGENT_NAME,
        "agent_version": clean_text(t.agent.version) if t.agent is not None else AGENT_VERSION,
        "trajectory_key": trajectory_key,
        "created_at": recorded_at(t),
    }


#: The columns of a step row, in the order `step_values` gives them.
STEP_COLUMNS: tuple[str, ...] = (
    "episode_id", "step_index", "history_hash", "started_at", "raw_output",
    "raw_output_truncated", "prompt_tokens", "completion_tokens", "cached_tokens", "cost_usd",
    "reasoning_content", "generation_latency_ms",
    "native_tool_calls", "parse_kind", "parse_error", "parse_tolerances", "parse_latency_ms",
    "call_id", "tool", "args", "final_answer", "parse_error_code", "finish_reason",
    "endpoint_retries", "response_model", "repetition_warning", "policy_perturbation", "observation", "exit_code", "signal",
    "timed_out", "error_type", "stdout", "stderr", "stdout_truncated", "stderr_truncated",
    "stdout_key", "stderr_key", "duration_ms", "cpu_ms", "max_rss_kib", "files_changed",
    "injected_fault_kind", "injected_fault", "soft_timeout_warning", "immediate_reward",
    "discounted_return", "is_copied_context", "observation_key",
)  # fmt: skip


def step_values(
    episode_id: uuid.UUID,
    s: StepData,
    *,
    output_keys: Mapping[str, str] | None = None,
    json: JsonFinisher = clean_json,
) -> tuple[Any, ...]:
    """One step's row as values in `STEP_COLUMNS` order.

    A tuple, not a dict: ingest builds one per step and COPY takes values in order
    (~30% less work per row than a dict turned into a tuple).
    """
    keys = output_keys or {}
    fault = s.injected_fault
    usage = s.resources
    return (
        episode_id,
        s.index,
        s.history_hash,
        s.started_at,
        clean_text(s.raw_output),
        s.raw_output_truncated,
        s.prompt_tokens,
        s.completion_tokens,
        s.cached_tokens,
        s.cost_usd,
        clean_text(s.reasoning_content) if s.reasoning_content is not None else None,
        s.generation_latency_ms,
        json(s.native_tool_calls) if s.native_tool_calls is not None else None,
        str(s.parse_kind),
        clean_text(s.parse_error) if s.parse_error else None,
        json(s.parse_tolerances),
        s.parse_latency_ms,
        clean_text(s.call_id) if s.call_id else None,
        clean_text(s.tool) if s.tool else None,
        json(s.args) if s.args is not None else None,
        clean_text(s.final_answer) if s.final_answer is not None else None,
        s.parse_error_code,
        s.finish_reason,
        s.endpoint_retries,
        clean_text(s.response_model) if s.response_model else None,
        s.repetition_warning,
        s.policy_perturbation,
        clean_text(s.observation) if s.observation is not None else None,
        s.exit_code,
        s.signal,
        s.timed_out,
        s.error_type,
        clean_text(s.stdout),
        clean_text(s.stderr),
        s.stdout_truncated,
        s.stderr_truncated,
        keys.get("stdout"),  # stdout_key
        keys.get("stderr"),  # stderr_key
        s.duration_ms,
        usage.cpu_ms if usage else None,  # cpu_ms
        usage.max_rss_kib if usage else None,  # max_rss_kib
        json([f.model_dump() for f in s.files_changed]),
        fault.kind if fault else None,  # injected_fault_kind
        json(fault.detail) if fault else None,  # injected_fault
        s.soft_timeout_warning,
        s.immediate_reward,
        s.return_,  # discounted_return
        s.is_copied_context,
        keys.get("observation"),  # observation_key
    )


STDOUT_KEY_AT = STEP_COLUMNS.index("stdout_key")
"""Position of `stdout_key` in step values (`stderr_key` follows it)."""


class EpisodeRows:
    """An episode's rows, built where the episode finished (`prepare_rows`) so the one
    writer only copies them: its `episode` row and its step rows as values in
    `STEP_COLUMNS` order.

    The object keys are not in them (`trajectory_key`, `stdout_key`, `stderr_key` are
    None): objects are written later, and ingest puts their keys in. A plain class, not a
    pydantic model or a dataclass: carried in an `EpisodeBundle`, its values are never
    validated or copied.
    """

    __slots__ = ("episode", "episode_id", "json_text", "steps")

    def __init__(
        self,
        episode_id: uuid.UUID,
        episode: dict[str, Any],
        steps: tuple[tuple[Any, ...], ...],
        *,
        json_text: bool,
    ) -> None:
        self.episode_id = episode_id
        self.episode = episode
        """The `episode` row, `trajectory_key` None."""
        self.steps = steps
        """One tuple per step, in step order."""
        self.json_text = json_text
        """JSON columns serialized (`json_text`, PostgreSQL's COPY) or Python values
        (`clean_json`, SQLite)."""

    def fits(self, t: Trajectory, *, json_text: bool) -> bool:
        """Built from `t` as it is now, for this writer: same episode, outcome (a storage
        error found after the episode finished changes it), steps and JSON form."""
        e = self.episode
        return (
            self.episode_id == t.episode_id
            and self.json_text == json_text
            and e["status"] == str(t.status)
            and e["failure_category"] == str(t.failure_category)
            and e["failure_reason"] == (clean_text(t.failure_reason) if t.failure_reason else None)
            and len(self.steps) == len(t.steps)
            and all(v[1] == s.index for v, s in zip(self.steps, t.steps, strict=True))
        )


def prepare_rows(t: Trajectory, *, json_text: bool) -> EpisodeRows:
    """`t`'s episode and step rows, built once the episode is final (rewards applied), for
    a writer on PostgreSQL (`json_text=True`) or SQLite."""
    finisher: JsonFinisher = _json_text if json_text else clean_json
    episode = episode_row(t, trajectory_key=None, json=finisher)
    steps = tuple(step_values(t.episode_id, s, json=finisher) for s in t.steps)
    return EpisodeRows(t.episode_id, episode, steps, json_text=json_text)


def with_output_keys(values: tuple[Any, ...], keys: Mapping[str, str]) -> tuple[Any, ...]:
    """Step values with the step's object keys (`stdout`/`stderr`/`observation` → key) put in."""
    at = STDOUT_KEY_AT
    return (
        *values[:at],
        keys.get("stdout"),
        keys.get("stderr"),
        *values[at + 2 : -1],
        keys.get("observation"),  # observation_key, the last column
    )


def step_row(
    episode_id: uuid.UUID,
    s: StepData,
    *,
    output_keys: Mapping[str, str] | None = None,
    json: JsonFinisher = clean_json,
) -> dict[str, Any]:
    """One step's row as a dict, column → value."""
    values = step_values(episode_id, s, output_keys=output_keys, json=json)
    return dict(zip(STEP_COLUMNS, values, strict=True))


def mark_storage_error(t: Trajectory, reason: str) -> Trajectory:
    """A copy of `t` recorded as a storage failure (its objects could not be written)."""
    from agent.trajectory import FailureCategory

    return t.model_copy(
        update={
            "status": EpisodeStatus.STORAGE_ERROR,
            "failure_category": FailureCategory.STORAGE_ERROR,
            "failure_reason": reason,
        }
    )
