"""GRPO's rollouts as episodes of one collection run: the source `training` is passed.

    result, rollouts = run_grpo_rollouts(
        training_run_key, tasks, settings,
        lambda source: run_episode_grpo(task_ids, job, source),
        engine=…, store=…,
    )

One collection run per training run, keyed `grpo-rollouts-<training run key>`
(`rollout_run_key`), opened once through the one lifecycle (`open_collection`: the run
key's lock, the engine and the store) and run by `Collection.run` (the run row, the one
status writer): its work is the training itself, in a worker thread, and it ends
`completed` when training returns, `failed` or `interrupted` when it raises. Each
generation batch the trainer asks for (from its thread) is one `run_episodes` call on the
collection's event loop: the episode loop in real nsjail sandboxes from a warm pool, the same
protocol v1, tools, limits, fault profile and verifier as any collection, rewards from
`scoring.rewards.apply_rewards`, every episode stored as it finishes (trajectory object
with its token ids and logprobs, `episode` and `step` rows). Rollout indices count up per
task over the whole training run, so every rollout is an episode of its own (its policy
seed is its rollout index). Then `admit` runs the online QC gate over the batch
(`expectations.gate.run_gate`: the rule judge, the episode and batch suites, the
re-encoding drift measured with the trainer's tokenizer) and stores its verdicts like any
gate's: one `qc_run` per batch on the rollout collection run, a `qc_result` and a
`judgement` per episode; the episodes it discards are not trained on
(`training.groups`). After the trainer judged the batch, `record` writes each episode's
`grpo_rollout` row (group, policy version, reward, advantage, fate; with per-turn
returns, each turn's advantage).

The online gate evaluates the suites with the `polars` engine by default: the same suite
files and verdicts as Great Expectations (the gate's reference evaluation), without
building a GX context for every optimiser step; `gate_engine="gx"` uses GX.

The policy of a batch is built from the trainer's current model by `make_policy`
(default: `agent.policies.hf.HFPolicy.from_loaded` over the trainer's model, or over a
copy of it in `generation_dtype` synced at each policy version, `agent.policies.hf_replica`;
sampling, the batch's concurrent episodes generated together; it records each step's
prompt and sampled ids and logprobs token-exact). A policy that keeps its record apart instead
(`TokenRecorder`) writes it onto each episode before it is stored.

Each batch runs with its own policy (`run_episodes(policy=…)`, the model as it is at
that optimiser step); the request names the base model as an `hf:` spec only as the
run's label (never loaded). The plan is empty (`planned` 0): the trainer's sampler
decides the episodes batch by batch.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import uuid
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Protocol, TypeVar, runtime_checkable

from sqlalchemy import Engine
from sqlalchemy.exc import DBAPIError

from agent.policies.base import Policy
from agent.policies.hf_replica import GenerationDtype
from agent.prompt import PromptStyle
from agent.trajectory import INFRASTRUCTURE_STATUSES, Trajectory, episode_id_for, utcnow
from collection.errors import CollectError
from collection.lifecycle import Collection, Executed, open_collection
from collection.plan import Plan, PlannedEpisode, Shard
from collection.request import CollectRequest
from collection.runner import run_episodes
from config.settings import Settings
from core.errors import reason_line
from core.worker_threads import in_worker_thread
from expectations.gate import GateEngine, run_gate
from expectations.settings import QcConfig
from models import GrpoRollout
from sandbox.spec import SandboxSpec
from scoring.quality import Verdict
from scoring.rule_judge import rule_judgement
from storage.errors import IngestError
from storage.grpo_rollouts import record_grpo_rollouts, rollout_run_key
from storage.objects import ObjectStore
from storage.qc import write_qc_run
from tasks.types import TaskInstance
from training.errors import TrainingStopped
from training.rollout_tokens import TokenRollout
from training.trainers.episode_grpo import JudgedBatch, RolloutBatch

__all__ = [
    "CollectionRolloutSource",
    "TokenRecorder",
    "rollout_run_key",
    "run_grpo_rollouts",
]

T = TypeVar("T")

STOP_POLL_S = 0.5
"""How often a thread waiting for a batch's episodes looks at `CollectionRolloutSource.stop`."""
STOP_UNWIND_S = 60.0
"""Most seconds a stopped batch's episodes are given to unwind (jails closed) before the
training thread ends."""

PolicyFactory = Callable[[RolloutBatch], Policy]
"""Builds the policy of one batch from the trainer's current model."""


@runtime_checkable
class TokenRecorder(Protocol):
    """A policy that keeps what it sampled apart and writes it onto a finished episode."""

    def record_tokens(self, trajectory: Trajectory) -> None: ...


def trainer_model_policy(
    *,
    run_key: str,
    prompt_style: PromptStyle,
    temperature: float,
    max_new_tokens: int,
    batch_size: int,
    settings: Settings,
    generation_dtype: GenerationDtype | None = None,
    batch_window_s: float = 0.0,
) -> PolicyFactory:
    """The default `PolicyFactory`: the trainer's model in-process (`HFPolicy.from_loaded`),
    sampling at `temperature`, up to `batch_size` episodes' turns decoded together, joining
    and leaving at every step (an idle policy waits up to `batch_window_s` for that many),
    its spec naming the run and the
    policy version. With `generation_dtype`, the turns are
    sampled from one copy of the model in that dtype, its weights copied from the
    trainer's at each policy version (`agent.policies.hf_replica`); None: from the
    trainer's model itself."""
    from agent.policies.hf import HFGeneration, HFPolicy
    from agent.policies.hf_replica import GenerationReplica

    replica = GenerationReplica(generation_dtype) if generation_dtype is not None else None

    def make(batch: RolloutBatch) -> Policy:
        model = (
            batch.model
            if replica is None
            else replica.sync(batch.model, version=batch.policy_version)
        )
        return HFPolicy.from_loaded(
            model,
            batch.tokenizer,
            settings.policy.model_copy(update={"max_tokens": max_new_tokens}),
            spec=f"hf:grpo/{run_key}@{batch.policy_version}",
            prompt_style=prompt_style,
            generation=HFGeneration(
                do_sample=True,
                temperature=temperature,
                max_batch_size=batch_size,
                batch_window_s=batch_window_s,
            ),
        )

    return make


class CollectionRolloutSource:
    """`training.trainers.episode_grpo.RolloutSource` over an opened collection."""

    def __init__(
        self,
        collection: Collection,
        tasks: Mapping[str, TaskInstance],
        *,
        make_policy: PolicyFactory,
        qc_config: QcConfig,
        gate_engine: GateEngine = "polars",
        training_run_id: uuid.UUID | None = None,
        stop: threading.Event | None = None,
    ) -> None:
        self.collection = collection
        self.tasks = dict(tasks)
        self.make_policy = make_policy
        self.qc_config = qc_config
        self.gate_engine: GateEngine = gate_engine
        self.training_run_id = training_run_id
        self.gates: list[uuid.UUID] = []
        """The `qc_run` of each batch, in order."""
        self.next_rollout: dict[str, int] = {}
        self.generated = 0
        """Episodes run so far."""
        self.recorded = 0
        """`grpo_rollout` rows written so far."""
        self.loop: asyncio.AbstractEventLoop | None = None
        """The collection's event loop, where the batches' episodes run (set while the
        training runs)."""
        self.stop = stop if stop is not None else threading.Event()
        """Set when the training is to stop (its collection was cancelled): a batch being
        generated is cancelled (its episodes unwind: jails closed, finished ones kept) and
        `generate` raises `TrainingStopped`."""

    def plan(self, batch: RolloutBatch) -> list[PlannedEpisode]:
        """The batch's episodes: each task's next `rollouts_per_task` rollout indices."""
        run_key = self.collection.run_key
        planned: list[PlannedEpisode] = []
        for task_id in batch.task_ids:
            task = self.tasks.get(task_id)
            if task is None:
                raise CollectError(f"GRPO asked for task {task_id}, which this run does not hold")
            first = self.next_rollout.get(task_id, 0)
            self.next_rollout[task_id] = first + batch.rollouts_per_task
            planned += [
                PlannedEpisode(
                    task=task, rollout_index=i, episode_id=episode_id_for(run_key, task_id, i)
                )
                for i in range(first, first + batch.rollouts_per_task)
            ]
        return planned

    def generate(self, batch: RolloutBatch) -> list[list[Trajectory]]:
        """Run and store the batch's episodes (see the module); one group per task. Called
        from the trainer's thread: the episodes run on the collection's event loop."""
        planned = self.plan(batch)
        policy = self.make_policy(batch)
        finished: dict[uuid.UUID, Trajectory] = {}

        def keep(trajectory: Trajectory) -> None:
            if isinstance(policy, TokenRecorder):
                policy.record_tokens(trajectory)
            finished[trajectory.episode_id] = trajectory

        tasks: list[asyncio.Task[None]] = []

        async def run() -> None:
            task = asyncio.current_task()
            assert task is not None
            tasks.append(task)
            try:
                await run_episodes(self.collection, planned, on_episode=keep, policy=policy)
            finally:
                await policy.aclose()

        if self.loop is None:
            raise CollectError("the rollout source is not running (run_grpo_rollouts runs it)")
        self._wait(asyncio.run_coroutine_threadsafe(run(), self.loop), tasks, batch)
        missing = [p.episode_id for p in planned if p.episode_id not in finished]
        if missing:
            raise CollectError(f"{len(missing)} GRPO rollout(s) did not finish, e.g. {missing[0]}")
        self.generated += len(planned)
        size = batch.rollouts_per_task
        ordered = [finished[p.episode_id] for p in planned]
        return [ordered[i : i + size] for i in range(0, len(ordered), size)]

    def _wait(
        self,
        running: concurrent.futures.Future[None],
        tasks: list[asyncio.Task[None]],
        batch: RolloutBatch,
    ) -> None:
        """Wait for a batch's episodes (`running`, its task on the loop in `tasks` once it
        started), or for `stop`: then cancel the task, wait (at most `STOP_UNWIND_S`) for
        its episodes to unwind, and raise `TrainingStopped`."""
        while True:
            try:
                running.result(timeout=STOP_POLL_S)
                return
            except concurrent.futures.TimeoutError:
                if not self.stop.is_set():
                    continue
            except (concurrent.futures.CancelledError, asyncio.CancelledError) as e:
                # Cancelled on the loop itself (a signal cancels every task of `asyncio.run`).
                raise TrainingStopped(
                    f"GRPO stopped while generating the rollouts of policy version "
                    f"{batch.policy_version}: they were cancelled"
                ) from e
            if tasks and self.loop is not None:
                # Cancelled on its loop, so `running` ends only once the episodes unwound.
                self.loop.call_soon_threadsafe(tasks[0].cancel)
                concurrent.futures.wait([running], timeout=STOP_UNWIND_S)
            else:  # not started yet: it never will
                running.cancel()
            raise TrainingStopped(
                f"GRPO stopped while generating the rollouts of policy version "
                f"{batch.policy_version}: asked to stop"
            )

    def admit(self, batch: RolloutBatch, groups: list[list[Trajectory]]) -> frozenset[uuid.UUID]:
        """The online QC gate over the batch's episodes (see the module): its verdicts
        stored as one `qc_run` of the rollout run; returns the ids it discarded.

        Raises:
            SuiteError, SuiteExecutionError: the gate's suites are missing or broke.
            IngestError: the verdicts could not be written (nothing of them was).
        """
        started = utcnow()
        episodes = [t for group in groups for t in group]
        rules = [rule_judgement(t, self.qc_config.judge) for t in episodes]
        report = run_gate(
            episodes,
            config=self.qc_config,
            rule_judgements=rules,
            engine=self.gate_engine,
            tokenizer_for=lambda policy: batch.tokenizer,
        )
        try:
            gate = write_qc_run(
                self.collection.engine,
                run_id=self.collection.run_id,
                report=report,
                judgements=rules,
                docs_key=None,
                started_at=started,
            )
        except DBAPIError as e:
            raise IngestError(
                f"cannot store the QC verdicts of GRPO batch {batch.policy_version}: "
                f"{reason_line(str(e))}"
            ) from e
        self.gates.append(gate)
        return frozenset(
            uuid.UUID(v.episode_id)
            for v in report.episode_verdicts()
            if v.verdict == Verdict.DISCARD
        )

    def record(self, judged: JudgedBatch) -> None:
        """Write each episode's `grpo_rollout` row (group, policy version, reward,
        advantage, fate) in one transaction.

        Raises:
            IngestError: the rows could not be written.
        """
        rows: list[GrpoRollout] = []
        for index, (group, rollouts) in enumerate(zip(judged.groups, judged.rollouts, strict=True)):
            advantages = group.advantages or [None] * len(group.trajectories)
            turns = group.turn_advantages or [None] * len(group.trajectories)
            for t, reward, advantage, per_turn, tokens in zip(
                group.trajectories, group.rewards, advantages, turns, rollouts, strict=True
            ):
                # A discarded rollout keeps its episode's reward here; qc_result says why
                # it was not trained on.
                reward = t.total_reward if t.status not in INFRASTRUCTURE_STATUSES else reward
                rows.append(
                    GrpoRollout(
                        episode_id=t.episode_id,
                        training_run_id=self.training_run_id,
                        policy_version=judged.batch.policy_version,
                        group_index=index,
                        task_id=group.task_id,
                        group_fate=group.fate.value,
                        reward=reward,
                        advantage=advantage,
                        turn_advantages=list(per_turn) if per_turn is not None else None,
                        **_token_counts(tokens),
                    )
                )
        self.recorded += record_grpo_rollouts(self.collection.engine, rows)


def _token_counts(rollout: TokenRollout | None) -> dict[str, int | None]:
    if rollout is None:
        return {"sampled_tokens": None, "observation_tokens": None}
    sampled = sum(rollout.env_mask)
    return {"sampled_tokens": sampled, "observation_tokens": len(rollout.env_mask) - sampled}


def _empty_planner(request: CollectRequest, settings: Settings, shard: Shard | None) -> Plan:
    """The trainer's sampler decides the episodes batch by batch: nothing planned ahead."""
    return Plan(request=request, faults=request.fault_profile, total=0, episodes=[])


def run_grpo_rollouts(
    training_run_key: str,
    tasks: Sequence[TaskInstance],
    settings: Settings,
    train: Callable[[CollectionRolloutSource], T],
    *,
    base_model_dir: Path,
    engine: Engine,
    store: ObjectStore,
    sandbox_spec: SandboxSpec | None = None,
    qc_config: QcConfig,
    gate_engine: GateEngine = "polars",
    concurrency: int = 4,
    make_policy: PolicyFactory | None = None,
    prompt_style: PromptStyle = PromptStyle.FULL,
    temperature: float = 1.0,
    max_new_tokens: int = 256,
    generation_dtype: GenerationDtype | None = None,
    batch_window_s: float = 0.0,
    training_run_id: uuid.UUID | None = None,
    stop: threading.Event | None = None,
) -> T:
    """Run `train` (the trainer, given the rollout source) as the work of the training
    run's rollout collection, and return what it returns. `qc_config` is the online QC
    gate's (the entry point's `load_qc_config()`). The collection is opened
    through the lifecycle and run by `Collection.run`: `completed` when `train` returns,
    `failed` (or `interrupted`) when it raises, which propagates. When the run is
    cancelled (Ctrl-C, SIGTERM, a flow's cancel), `stop` (the source's; give the trainer's
    `TrainJob.stop` the same event) is set and the training thread is waited for: it ends
    within a micro-batch, or at once while it waits for rollouts (those are cancelled and
    unwind), so no thread outlives the run's jails, database and store.

    Raises:
        CollectError: no task, or tasks of several suites.
        StorageError: the database or store cannot be used, or the run key is busy.
    """
    if not tasks:
        raise CollectError("GRPO rollouts need at least one task")
    suites = sorted({t.suite for t in tasks})
    if len(suites) != 1:
        raise CollectError(f"GRPO rollouts of one run come from one suite, got {suites}")
    run_key = rollout_run_key(training_run_key)
    request = CollectRequest(
        suite=suites[0],
        policy=f"hf:{base_model_dir}",
        templates=sorted({t.template for t in tasks}),
        concurrency=concurrency,
        sandbox_spec=sandbox_spec or SandboxSpec(),
        run_key=run_key,
    )
    factory = make_policy or trainer_model_policy(
        run_key=run_key,
        prompt_style=prompt_style,
        temperature=temperature,
        max_new_tokens=max_new_tokens,
        batch_size=concurrency,
        settings=settings,
        generation_dtype=generation_dtype,
        batch_window_s=batch_window_s,
    )
    trained: list[T] = []

    async def main() -> None:
        async with open_collection(
            request, settings, engine=engine, store=store, planner=_empty_planner
        ) as collection:
            source = CollectionRolloutSource(
                collection,
                {t.task_id: t for t in tasks},
                make_policy=factory,
                qc_config=qc_config,
                gate_engine=gate_engine,
                training_run_id=training_run_id,
                stop=stop,
            )
            source.loop = asyncio.get_running_loop()

            async def training(collection: Collection, todo: list[PlannedEpisode]) -> Executed:
                trained.append(await in_worker_thread(lambda: train(source), stop=source.stop))
                written = collection.written
                return Executed(episodes=len(written.inserted), steps=written.steps)

            await collection.run(training)

    asyncio.run(main())
    return trained[0]
