"""Evaluation episodes: a policy on given task instances, run as a collection.

An evaluation is a collection run like any other (`collection.lifecycle.open_collection`
with `tasks_planner` and the caller's policy, run by `collection.runner.collect`): it
holds its run key's lock, its run row is written and ended by `Collection.run` (the one
status writer), its episodes stream through the outbox and the warm pool of jails, are
rewarded by `scoring.rewards.apply_rewards` and stored like collected ones. A re-run of
the same key resumes: only the episodes not stored yet run, and the stored ones are read
back, so the caller always gets every planned episode.

The metrics over the episodes are `training.evaluation`'s (pure). Nothing here imports
Prefect or torch.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Sequence
from pathlib import Path

from sqlalchemy import Engine

from agent.policies.base import Policy
from agent.settings import LoopSettings
from agent.trajectory import EpisodeStatus, Trajectory
from collection.lifecycle import open_collection, tasks_planner
from collection.request import CollectRequest
from collection.runner import collect
from config.settings import Settings
from core.progress import PROGRESS_EVERY_S, ProgressReporter, log_lines
from storage.episodes import load_trajectory
from storage.objects import ObjectStore
from tasks.types import TaskInstance

__all__ = ["PROGRESS_LOGGER", "evaluation_settings", "run_evaluation", "run_model_evaluation"]

PROGRESS_LOGGER = "training.progress"
"""The logger of evaluation's progress lines (the trainer's too: one stream to watch)."""


def evaluation_settings(
    settings: Settings, *, max_steps: int, max_parse_failures: int | None = None
) -> Settings:
    """`settings` with an evaluation's episode budget: `max_steps` assistant turns, and at
    most `max_parse_failures` unparsable turns in a row (None: `max_steps`, so an
    untrained model runs its whole budget instead of stopping at the first garbage)."""
    loop = LoopSettings.model_validate(  # validated: the same bounds as from the environment
        {
            **settings.loop.model_dump(),
            "max_steps": max_steps,
            "max_consecutive_parse_failures": max_parse_failures or max_steps,
        }
    )
    return dataclasses.replace(settings, loop=loop)


async def run_evaluation(
    policy: Policy,
    tasks: Sequence[TaskInstance],
    *,
    run_key: str,
    suite: str,
    settings: Settings,
    engine: Engine | None = None,
    store: ObjectStore | None = None,
    concurrency: int = 2,
    progress_every_s: float = PROGRESS_EVERY_S,
    flow_run_id: str | None = None,
) -> list[Trajectory]:
    """One episode per task with `policy` (the caller's: built and closed by it), in real
    sandboxes, `concurrency` at a time, stored as the collection run `run_key` of `suite`;
    every planned episode is returned, in task order (those of an earlier, interrupted
    run of the key read back from storage).

    `settings` is the entry point's (see `evaluation_settings` for the episode budget);
    `engine` and `store`, when given, are the caller's to keep. Progress (episodes done /
    total, successes, rate, ETA) is a line on the `PROGRESS_LOGGER` logger at least every
    `progress_every_s` (`core.progress`). `flow_run_id` (the Prefect flow run running
    it, if any) is recorded on the run row.

    Raises:
        StorageError: the database or object store cannot be used, or `run_key` is being
            collected right now (`RunKeyBusy`).
        CollectError: the run could not complete (its episodes stored so far are kept).
    """
    request = CollectRequest(
        suite=suite, policy=policy.spec, run_key=run_key, concurrency=concurrency
    )
    finished: dict[object, Trajectory] = {}
    successes = 0
    progress = ProgressReporter(
        f"evaluate {run_key}",
        total=len(tasks),
        unit="episode",
        every_s=progress_every_s,
        emit=log_lines(logging.getLogger(PROGRESS_LOGGER)),
    )

    def on_episode(trajectory: Trajectory) -> None:
        nonlocal successes
        finished[trajectory.episode_id] = trajectory
        successes += trajectory.status == EpisodeStatus.SUCCESS
        progress.update(len(finished), successes=successes)

    async with open_collection(
        request,
        settings,
        engine=engine,
        store=store,
        planner=tasks_planner(tasks),
        policy=policy,
    ) as collection:
        collection.flow_run_id = flow_run_id
        with progress:
            progress.update(0, successes=0)
            await collect(collection, on_episode=on_episode)
        episodes: list[Trajectory] = []
        for planned in collection.plan.episodes:
            trajectory = finished.get(planned.episode_id)
            if trajectory is None:  # stored by an earlier run of the key
                trajectory = await asyncio.to_thread(
                    load_trajectory, collection.engine, collection.store, planned.episode_id
                )
            episodes.append(trajectory)
        return episodes


async def run_model_evaluation(
    model_dir: Path,
    tasks: Sequence[TaskInstance],
    *,
    run_key: str,
    suite: str,
    settings: Settings,
    max_new_tokens: int,
    spec: str | None = None,
    engine: Engine | None = None,
    store: ObjectStore | None = None,
    concurrency: int = 2,
    torch_threads: int = 0,
    flow_run_id: str | None = None,
) -> list[Trajectory]:
    """`run_evaluation` with the `hf:` policy of the checkpoint at `model_dir` (greedy, at
    most `max_new_tokens` a turn; its episodes labelled `spec`, default `hf:<model_dir>`),
    generating with `torch_threads` intra-op threads (0: `training.threads`' choice for
    the machine's load; on a busy machine one thread decodes many times faster)."""
    from agent.policies.hf import HFPolicy
    from training.threads import tuned_threads

    policy = HFPolicy(
        model_dir,
        settings.policy.model_copy(update={"max_tokens": max_new_tokens}),
        spec=spec,
    )
    try:
        with tuned_threads(torch_threads):
            return await run_evaluation(
                policy,
                tasks,
                run_key=run_key,
                suite=suite,
                settings=settings,
                engine=engine,
                store=store,
                concurrency=concurrency,
                flow_run_id=flow_run_id,
            )
    finally:
        await policy.aclose()
