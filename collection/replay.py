"""Replay: re-execute an episode's recorded tool calls in a fresh jail and compare.

Same task instance (regenerated from suite, template and seed), same sandbox spec, same
fault profile and seed. Each tool-call step's observation (exit code, signal, timeout,
error type, stdout/stderr, files changed with hashes, injected fault) is compared with
the recorded one; the first difference is reported, never hidden. Results are stored in
`replay_result`, so the reproducibility rate per suite is a SQL query
(`reproducibility_by_suite`).
"""

from __future__ import annotations

import hashlib
import uuid
from typing import Any

from pydantic import BaseModel
from sqlalchemy import Engine

from agent.render import decode_step_text
from agent.trajectory import ParseKind, Step, Trajectory
from collection.errors import CollectError
from config.settings import Settings
from sandbox import open_sandbox
from sandbox.faults import FaultProfile
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec
from sandbox.types import ToolResult
from storage.episodes import load_trajectory
from storage.objects import ObjectStore
from storage.replays import record_replay
from storage.run_reads import run_sandbox_spec
from suites.registry import load_suite
from suites.settings import SuitesSettings


class ReplayReport(BaseModel):
    """What `epiflow replay --json` prints."""

    episode_id: uuid.UUID
    """Episode replayed."""
    steps: int
    """Tool-call steps replayed."""
    identical_steps: int
    """Steps that matched."""
    first_divergence: dict[str, Any] | None
    """`{step, field, recorded, replayed}` of the first difference; None when identical."""


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def observation_fields(step: Step) -> dict[str, Any]:
    """The comparable parts of a recorded step."""
    return {
        "exit_code": step.exit_code,
        "signal": step.signal,
        "timed_out": step.timed_out,
        "error_type": step.error_type,
        "stdout": _digest(step.stdout),
        "stderr": _digest(step.stderr),
        "files_changed": sorted((f.path, f.change, f.sha256) for f in step.files_changed),
        "injected_fault": step.injected_fault.kind if step.injected_fault else None,
    }


def result_fields(result: ToolResult, text_cap: int) -> dict[str, Any]:
    """The same parts of a replayed call, decoded exactly as the loop records them."""
    return {
        "exit_code": result.exit_code,
        "signal": result.signal,
        "timed_out": result.timed_out,
        "error_type": result.error_type,
        "stdout": _digest(decode_step_text(result.stdout, text_cap)[0]),
        "stderr": _digest(decode_step_text(result.stderr, text_cap)[0]),
        "files_changed": sorted((f.path, f.change, f.sha256) for f in result.files_changed),
        "injected_fault": result.injected_fault.kind if result.injected_fault else None,
    }


async def replay_trajectory(
    t: Trajectory,
    spec: SandboxSpec,
    *,
    text_cap: int,
    sandbox: SandboxSettings,
    suites: SuitesSettings,
) -> ReplayReport:
    """Replay `t` in a fresh jail and compare each tool-call step."""
    suite = load_suite(t.suite, settings=suites, sandbox=sandbox)
    task = suite.generate(t.template, t.instance_seed)
    calls = [
        s for s in t.steps if s.parse_kind == ParseKind.TOOL_CALL and s.tool and s.args is not None
    ]
    if task.task_id != t.task_id:
        return ReplayReport(
            episode_id=t.episode_id,
            steps=len(calls),
            identical_steps=0,
            first_divergence={
                "step": None,
                "field": "task",
                "recorded": t.task_id,
                "replayed": task.task_id,
            },
        )
    faults = FaultProfile.model_validate(t.fault_profile) if t.fault_profile else None
    identical = 0
    first: dict[str, Any] | None = None
    async with await open_sandbox(
        spec, files=task.files, faults=faults, fault_seed=t.fault_seed or 0, settings=sandbox
    ) as jail:
        for step in calls:
            assert step.tool is not None and step.args is not None
            replayed = result_fields(await jail.call_tool(step.tool, step.args), text_cap)
            recorded = observation_fields(step)
            diff = next((k for k in recorded if recorded[k] != replayed[k]), None)
            if diff is None:
                identical += 1
            elif first is None:
                first = {
                    "step": step.index,
                    "field": diff,
                    "recorded": recorded[diff],
                    "replayed": replayed[diff],
                }
    return ReplayReport(
        episode_id=t.episode_id, steps=len(calls), identical_steps=identical, first_divergence=first
    )


async def replay_episode(
    engine: Engine, store: ObjectStore, episode_id: uuid.UUID, *, settings: Settings
) -> ReplayReport:
    """Load the episode, replay it in a fresh jail, store the comparison, return it.

    Raises:
        CollectError: the run's recorded sandbox spec does not hash to the episode's.
        StorageError: the episode or its trajectory object cannot be read.
    """
    trajectory = load_trajectory(engine, store, episode_id)
    spec_json = run_sandbox_spec(engine, trajectory.run_key)
    spec = SandboxSpec.model_validate(spec_json) if spec_json else SandboxSpec()
    if spec.spec_hash() != trajectory.sandbox_spec_hash:
        raise CollectError(
            f"episode {episode_id}: the run's recorded sandbox spec does not hash to the episode's "
            f"({trajectory.sandbox_spec_hash[:12]}…); cannot replay faithfully"
        )
    report = await replay_trajectory(
        trajectory,
        spec,
        text_cap=settings.loop.step_text_max_chars,
        sandbox=settings.sandbox,
        suites=settings.suites,
    )
    record_replay(
        engine,
        episode_id=episode_id,
        steps=report.steps,
        identical_steps=report.identical_steps,
        first_divergence=report.first_divergence,
    )
    return report
