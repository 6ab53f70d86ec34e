"""The plan of a collection: its task instances and one deterministic episode per
(task, rollout), split into shards. Pure: no SQL, no sandbox, no Prefect.

Episode ids are deterministic (run key, task id, rollout index), so planning the same
request again plans the same episodes, and storage turns a re-run into "complete what is
missing".
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict, Field

from agent.trajectory import episode_id_for
from collection.errors import CollectError, RequestError
from collection.request import CollectRequest
from sandbox.faults import FaultProfile
from sandbox.settings import SandboxSettings
from suites.errors import SuiteError
from suites.registry import load_suite
from suites.settings import SuitesSettings
from tasks.types import TaskInstance


class Shard(BaseModel):
    """Which part of a run this process collects when the run is split across workers."""

    model_config = ConfigDict(frozen=True)

    index: int = Field(default=0, ge=0)
    """This shard's index (0-based)."""
    count: int = Field(default=1, ge=1)
    """Number of shards the run is split into."""


class PlannedEpisode(BaseModel):
    """One episode to run."""

    model_config = ConfigDict(frozen=True)

    task: TaskInstance
    """The task instance."""
    rollout_index: int
    """Rollout of that task."""
    episode_id: uuid.UUID
    """Its deterministic id."""


@dataclass(frozen=True)
class Plan:
    """A request resolved against its suite: what it collects, before anything runs."""

    request: CollectRequest
    """The request, with its run key set."""
    faults: FaultProfile | None
    """The fault profile in force; None when off."""
    total: int
    """Episodes of the whole run (every shard)."""
    episodes: list[PlannedEpisode]
    """This shard's episodes, in plan order."""

    @property
    def run_key(self) -> str:
        assert self.request.run_key is not None
        return self.request.run_key


def plan_collection(
    request: CollectRequest,
    suites: SuitesSettings,
    *,
    sandbox: SandboxSettings,
    shard: Shard | None = None,
) -> Plan:
    """Resolve `request` (which must carry a run key) into its plan for `shard`, the suite
    found with `suites` (a user suite's generators run in jails of `sandbox`).

    Raises:
        RequestError: the suite or a template does not exist.
        CollectError: the request has no run key.
    """
    if request.run_key is None:
        raise CollectError("the request has no run key", setting="--run-key")
    shard = shard or Shard()
    try:
        suite = load_suite(request.suite, settings=suites, sandbox=sandbox)
        pick = suite.heldout_instances if request.heldout else suite.instances
        tasks = pick(request.tasks, seed=request.seed, templates=request.templates)
    except SuiteError as e:
        raise RequestError(f"--suite {request.suite!r}: {e}", setting="--suite") from e
    return plan_tasks(request, tasks, shard=shard)


def plan_tasks(
    request: CollectRequest, tasks: Sequence[TaskInstance], *, shard: Shard | None = None
) -> Plan:
    """The plan of `request` (which must carry a run key) over the given task instances,
    each × `request.rollouts`, for `shard` (the suite is not consulted: evaluation's
    held-out tasks, an RL batch's prompts).

    Raises:
        CollectError: the request has no run key.
    """
    if request.run_key is None:
        raise CollectError("the request has no run key", setting="--run-key")
    shard = shard or Shard()
    pairs = [(task, rollout) for task in tasks for rollout in range(request.rollouts)]
    episodes = [
        PlannedEpisode(
            task=task,
            rollout_index=rollout,
            episode_id=episode_id_for(request.run_key, task.task_id, rollout),
        )
        for i, (task, rollout) in enumerate(pairs)
        if i % shard.count == shard.index % shard.count
    ]
    return Plan(request=request, faults=request.fault_profile, total=len(pairs), episodes=episodes)
