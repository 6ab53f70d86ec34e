"""Episode collection as plain functions: plan, run concurrently, persist in batches, resume.

The Prefect flows in `flows/collect.py` call these; tests call them directly too.
Episode ids are deterministic (run key, task id, rollout index), so planning against the
database turns a re-run of the same run key into "complete what is missing".
"""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import Engine, delete, select, update
from sqlmodel import col

from agent.errors import PolicySpecError
from agent.loop import run_episode
from agent.policies import make_policy
from agent.policies.base import Policy
from agent.settings import LoopSettings, PolicySettings
from agent.trajectory import EpisodeStatus, Trajectory, episode_id_for
from collection.errors import CollectError
from models import Artifact, CollectionRun, Episode, run_id_for
from models import Step as StepRow
from sandbox import pooled_opener
from sandbox.faults import FaultProfile
from sandbox.settings import SandboxSettings
from sandbox.spec import SandboxSpec
from scoring.rewards import apply_rewards
from scoring.settings import RewardSettings
from storage.episodes import persist_episodes
from storage.ingest import IngestReport
from storage.objects import ObjectStore
from suites.errors import SuiteError
from suites.registry import load_suite
from suites.types import TaskInstance

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
"""Named fault profiles for `--faults`; a JSON object with `FaultProfile` fields works too."""


def resolve_faults(value: str | dict[str, Any] | FaultProfile | None) -> FaultProfile | None:
    """A profile from a name (`none`, `light`, `heavy`), a JSON string or a dict; None when off."""
    if value is None or isinstance(value, FaultProfile):
        profile = value
    elif isinstance(value, dict):
        profile = FaultProfile.model_validate(value)
    elif value.strip().startswith("{"):
        try:
            profile = FaultProfile.model_validate_json(value)
        except ValueError as e:
            raise CollectError(f"--faults: invalid fault profile JSON: {e}") from e
    elif value in FAULT_PROFILES:
        profile = FAULT_PROFILES[value]
    else:
        names = ", ".join(FAULT_PROFILES)
        raise CollectError(f"--faults: unknown profile {value!r} (use one of {names}, or JSON)")
    return profile if profile is not None and profile.enabled else None


class CollectRequest(BaseModel):
    """What to collect. Every field is a Prefect flow parameter too."""

    model_config = ConfigDict(extra="forbid")

    suite: str = "builtin"
    """Suite name (built-in or a user suite on EPIFLOW_SUITES_PATH)."""
    policy: str = "scripted:oracle"
    """Policy spec: scripted:oracle|noisy|idle, openai:…, hf:…"""
    tasks: int = Field(default=1, ge=1)
    """Task instances per template."""
    rollouts: int = Field(default=1, ge=1)
    """Rollouts per task instance."""
    concurrency: int = Field(default=4, ge=1, le=512)
    """Episodes running at once."""
    faults: str | None = None
    """Fault profile: a name (none, light, heavy) or a JSON object; None is off."""
    spec: SandboxSpec = Field(default_factory=SandboxSpec)
    """Sandbox spec of every episode."""
    run_key: str
    """Key of the run; re-running the same key completes only what is missing."""
    seed: int = Field(default=0, ge=0)
    """First instance seed (instances use seed … seed+tasks-1)."""
    templates: list[str] | None = None
    """Restrict to these templates (default: all of the suite)."""
    batch_size: int = Field(default=16, ge=1)
    """Episodes persisted per transaction."""
    shard_index: int = Field(default=0, ge=0)
    """This shard's index when a run is split across workers."""
    shard_count: int = Field(default=1, ge=1)
    """Number of shards the run is split into."""
    heldout: bool = False
    """Use the suite's held-out seeds (evaluation) instead of training seeds."""


class PlannedEpisode(BaseModel):
    """One episode to run."""

    model_config = ConfigDict(frozen=True)

    task: TaskInstance
    """The task instance."""
    rollout_index: int
    """Rollout of that task."""
    episode_id: uuid.UUID
    """Its deterministic id."""


class CollectResult(BaseModel):
    """What a collection did (the CLI's JSON)."""

    run_id: uuid.UUID
    """Id of the collection run row."""
    run_key: str
    """Its key."""
    planned: int
    """Episodes in the plan (all shards of this request)."""
    episodes: int
    """Episodes of this run now in the database (resumed ones included)."""
    executed: int
    """Episodes this call ran (the rest were already there)."""
    steps: int
    """Steps written by this call."""
    by_status: dict[str, int]
    """Episodes of the run by status."""
    success_rate: float
    """Successful episodes / episodes of the run."""
    duration_s: float
    """Wall time of this call."""


def task_instances(request: CollectRequest) -> list[TaskInstance]:
    """The task instances of a request (deterministic)."""
    try:
        suite = load_suite(request.suite)
        if request.heldout:
            return suite.heldout_instances(
                request.tasks, seed=request.seed, templates=request.templates
            )
        return suite.instances(request.tasks, seed=request.seed, templates=request.templates)
    except SuiteError as e:
        raise CollectError(f"--suite {request.suite!r}: {e}") from e


def plan_episodes(request: CollectRequest, tasks: Sequence[TaskInstance]) -> list[PlannedEpisode]:
    """Every (task, rollout) of the request that belongs to its shard."""
    pairs = [(task, rollout) for task in tasks for rollout in range(request.rollouts)]
    return [
        PlannedEpisode(
            task=task,
            rollout_index=rollout,
            episode_id=episode_id_for(request.run_key, task.task_id, rollout),
        )
        for i, (task, rollout) in enumerate(pairs)
        if i % request.shard_count == request.shard_index % request.shard_count
    ]


def pending(engine: Engine, plan: Sequence[PlannedEpisode]) -> list[PlannedEpisode]:
    """The planned episodes not yet stored. Episodes stored as `storage_error` are removed so
    they run again (their objects were never all written)."""
    ids = [p.episode_id for p in plan]
    done: set[uuid.UUID] = set()
    retry: set[uuid.UUID] = set()
    with engine.begin() as conn:
        for i in range(0, len(ids), 500):
            rows = conn.execute(
                select(col(Episode.id), col(Episode.status)).where(
                    col(Episode.id).in_(ids[i : i + 500])
                )
            ).all()
            for eid, status in rows:
                (retry if status == EpisodeStatus.STORAGE_ERROR else done).add(eid)
        if retry:
            targets = list(retry)
            conn.execute(delete(Artifact).where(col(Artifact.episode_id).in_(targets)))
            conn.execute(delete(StepRow).where(col(StepRow.episode_id).in_(targets)))
            conn.execute(delete(Episode).where(col(Episode.id).in_(targets)))
    return [p for p in plan if p.episode_id not in done]


def open_run(engine: Engine, request: CollectRequest) -> uuid.UUID:
    """Create (or resume) the `collection_run` row."""
    from sqlalchemy.dialects.postgresql import insert as pg_insert
    from sqlalchemy.dialects.sqlite import insert as sqlite_insert

    run_id = run_id_for(request.run_key)
    faults = resolve_faults(request.faults)
    row = {
        "id": run_id,
        "run_key": request.run_key,
        "suite": request.suite,
        "policy_id": request.policy,
        "parameters": json.loads(request.model_dump_json(exclude={"spec"})),
        "sandbox_spec": json.loads(request.spec.canonical_json()),
        "fault_profile": faults.model_dump(mode="json") if faults else {},
        "status": "running",
        "prefect_flow_run_id": None,
        "started_at": datetime.now(UTC),
        "ended_at": None,
    }
    insert = pg_insert if engine.dialect.name == "postgresql" else sqlite_insert
    with engine.begin() as conn:
        conn.execute(insert(CollectionRun).values(**row).on_conflict_do_nothing())
        conn.execute(
            update(CollectionRun)
            .where(col(CollectionRun.id) == run_id)
            .values(status="running", ended_at=None, parameters=row["parameters"])
        )
    return run_id


def close_run(
    engine: Engine, run_id: uuid.UUID, *, status: str, flow_run_id: str | None = None
) -> None:
    values: dict[str, Any] = {"status": status, "ended_at": datetime.now(UTC)}
    if flow_run_id:
        values["prefect_flow_run_id"] = flow_run_id
    with engine.begin() as conn:
        conn.execute(update(CollectionRun).where(col(CollectionRun.id) == run_id).values(**values))


async def run_and_persist(
    plan: Sequence[PlannedEpisode],
    request: CollectRequest,
    *,
    engine: Engine,
    store: ObjectStore,
    loop_settings: LoopSettings,
    policy: Policy,
    reward_settings: RewardSettings | None = None,
    sandbox_settings: SandboxSettings | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
) -> IngestReport:
    """Run `plan` with at most `request.concurrency` episodes at once; persist every
    `request.batch_size` finished episodes (objects first, then one transaction of rows),
    with immediate rewards and discounted returns computed on the way,
    so a crash loses at most the episodes in flight and the batch being written."""
    faults = resolve_faults(request.faults)
    rewards = reward_settings or RewardSettings()
    # Built once per batch, not once per episode (reading the environment costs ~6 ms).
    settings = sandbox_settings or SandboxSettings()
    semaphore = asyncio.Semaphore(request.concurrency)
    total = IngestReport()
    buffer: list[Trajectory] = []
    lock = asyncio.Lock()

    async def flush() -> None:
        batch = list(buffer)
        buffer.clear()
        if batch:
            report = await asyncio.to_thread(persist_episodes, engine, store, batch)
            total.inserted.extend(report.inserted)
            total.skipped_existing.extend(report.skipped_existing)
            total.steps += report.steps

    async def one(p: PlannedEpisode) -> None:
        async with semaphore:
            trajectory = await run_episode(
                p.task,
                policy,
                spec=request.spec,
                run_key=request.run_key,
                settings=loop_settings,
                rollout_index=p.rollout_index,
                faults=faults,
                fault_seed=_fault_seed(p.episode_id),
                open_sandbox=pool.open_sandbox,
            )
        trajectory.difficulty = p.task.difficulty
        # Step rewards and discounted returns are stored with the rows (seed 000 §4.3).
        trajectory = apply_rewards(trajectory, rewards)
        if on_episode is not None:
            on_episode(trajectory)
        async with lock:
            buffer.append(trajectory)
            if len(buffer) >= request.batch_size:
                await flush()

    # Jails come from a warm pool: an episode's cold start overlaps other episodes' work.
    async with pooled_opener(
        request.spec, concurrency=request.concurrency, settings=settings, episodes=len(plan)
    ) as pool:
        await asyncio.gather(*(one(p) for p in plan))
    async with lock:
        await flush()
    return total


def _fault_seed(episode_id: uuid.UUID) -> int:
    """Per-episode fault seed derived from the deterministic id, so a replay injects the same faults."""
    return int.from_bytes(episode_id.bytes[:4], "big")


def run_counts(engine: Engine, run_id: uuid.UUID) -> dict[str, int]:
    from sqlalchemy import func

    with engine.connect() as conn:
        rows = conn.execute(
            select(col(Episode.status), func.count())
            .where(col(Episode.run_id) == run_id)
            .group_by(col(Episode.status))
        ).all()
    return {str(status): int(n) for status, n in rows}


def make_run_policy(spec: str, settings: PolicySettings | None = None) -> Policy:
    """The policy a run uses (one instance shared by all its episodes)."""
    try:
        return make_policy(spec, settings=settings or PolicySettings())
    except PolicySpecError as e:
        raise CollectError(f"--policy: {e}") from e


async def collect_in_process(
    request: CollectRequest,
    *,
    engine: Engine,
    store: ObjectStore,
    loop_settings: LoopSettings | None = None,
    reward_settings: RewardSettings | None = None,
    on_episode: Callable[[Trajectory], None] | None = None,
    close: bool = True,
) -> uuid.UUID:
    """The whole collection without Prefect: open (or resume) the run, run what is missing,
    persist it, mark the run completed (failed on error). Returns the run id.

    The flows use the same steps with Prefect tasks around the batches; benchmarks, tests
    and notebooks call this directly.
    """
    run_id = open_run(engine, request)
    plan = pending(engine, plan_episodes(request, task_instances(request)))
    policy = make_run_policy(request.policy)
    status = "failed"
    try:
        await run_and_persist(
            plan,
            request,
            engine=engine,
            store=store,
            loop_settings=loop_settings or LoopSettings(),
            policy=policy,
            reward_settings=reward_settings,
            on_episode=on_episode,
        )
        status = "completed"
    finally:
        await policy.aclose()
        if close:
            close_run(engine, run_id, status=status)
    return run_id
