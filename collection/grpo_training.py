"""`epiflow train --algo grpo`: agentic GRPO over whole episodes, registered like any training.

    trained = train_grpo_model(engine, store, dataset_id=…, work_dir=…, training=…,
                               settings=…, qc_config=…, base_checkpoint_id=…)
    register_checkpoint(engine, store, trained, settings=training)   # training.pipeline

The tasks are a `grpo` snapshot's (one row per task, with the coordinates that regenerate
it from its suite: `suite`, `template`, `instance_seed`, `task_id`), so a GRPO training
run records its dataset like every other (`training_run.dataset_id`, lineage through
`dataset_episode`); `templates` narrows them. The run:

1. fetches the base (or SFT) checkpoint, refuses it when its chat template cannot render
   protocol v1 (`check_protocol_template`: nothing opened, no jail started); with a token
   budget (`TrainingSettings.rl_tokens_per_step`) converts it into groups per optimiser
   step (`plan_rollout_budget`: the mean length of the tasks' source episodes, rendered
   with the base's tokenizer); opens the `training_run` row (running; its config records
   the settings the trainer runs with and the budget as `token_budget`);
2. runs `collection.grpo_rollouts.run_grpo_rollouts` with the rollout run key derived from
   the training run's id (`grpo-rollouts-<training run id>`) and the trainer
   `training.trainers.episode_grpo.run_episode_grpo`, the base as the frozen reference;
3. returns the `training.pipeline.TrainedModel` that `register_checkpoint` uploads and
   closes (checkpoint row, its parent the base checkpoint, the training run completed).

A failure, a cancellation or an interrupt closes the training run `failed` (the rollout
run is closed `failed` or `interrupted` by `Collection.run`); a killed process (SIGKILL,
the OOM killer) leaves both `running`, its jails end by themselves, and the next training
on the host (or `epiflow db orphans --fix`) finds its owner process gone and marks the
training run `crashed` and its rollout run `interrupted`
(`training.registry.mark_crashed_training_runs`): no one runs that run key again.

The one-turn GRPO of `training.trainers.grpo` (a rollout is one assistant turn rewarded by
`training.rewards.SandboxReward`) is no longer what `--algo grpo` runs; it stays callable
as `training.pipeline.train_checkpoint(algo="grpo")` until it is removed.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine

from config.settings import Settings
from expectations.settings import QcConfig
from storage.episodes import load_trajectory
from storage.errors import ObjectNotFound
from storage.objects import ObjectStore
from tasks.types import TaskInstance
from training.builders import DatasetKind
from training.errors import ChatTemplateError, TrainerError
from training.pipeline import TrainedModel
from training.protocol_template import protocol_template_problem
from training.registry import fail_training_run, fetch_checkpoint, start_training_run
from training.rewards import suite_task_resolver
from training.settings import TrainingSettings
from training.snapshots import get_snapshot, read_snapshot
from training.token_budget import TokenBudget, plan_token_budget, rollout_token_counts
from training.trainers import Algo
from training.trainers.common import TrainJob

if TYPE_CHECKING:
    from training.callbacks import MetricsHook

__all__ = [
    "check_base_checkpoint",
    "check_protocol_template",
    "grpo_tasks",
    "plan_rollout_budget",
    "train_grpo_model",
]

logger = logging.getLogger(__name__)

MEASURED_EPISODES = 256
"""Most source episodes the token budget's mean rollout length is measured over (evenly
spread over the snapshot's order): enough for a mean, a bounded read on a large snapshot."""


def grpo_tasks(
    engine: Engine,
    store: ObjectStore,
    dataset_id: uuid.UUID,
    settings: Settings,
    *,
    templates: Sequence[str] | None = None,
) -> list[TaskInstance]:
    """The tasks of `grpo` snapshot `dataset_id`, regenerated from their suites, in the
    snapshot's order; only `templates` when given.

    Raises:
        SnapshotError: the snapshot is missing or corrupt.
        TrainerError: it is not a `grpo` snapshot, a task no longer regenerates as it was,
            or no task is left.
    """
    info = get_snapshot(engine, dataset_id)
    if info.kind != DatasetKind.GRPO:
        raise TrainerError(f"grpo trains on grpo snapshots, not {info.kind.value}")
    frame = read_snapshot(store, info)
    resolve = suite_task_resolver(settings.suites, settings.sandbox)
    tasks: list[TaskInstance] = []
    for row in frame.select("suite", "template", "instance_seed", "task_id").iter_rows():
        suite, template, seed, task_id = row
        if templates and template not in templates:
            continue
        try:
            tasks.append(resolve(str(suite), str(template), int(seed), str(task_id)))
        except (ValueError, KeyError) as e:
            raise TrainerError(f"snapshot {info.id}: task {task_id}: {e}") from e
    if not tasks:
        wanted = f" of templates {', '.join(templates)}" if templates else ""
        raise TrainerError(f"snapshot {info.id} holds no task{wanted} to train on")
    return tasks


def plan_rollout_budget(
    engine: Engine,
    store: ObjectStore,
    *,
    dataset_id: uuid.UUID,
    base_dir: Path,
    training: TrainingSettings,
    templates: Sequence[str] | None = None,
) -> TokenBudget | None:
    """`training.rl_tokens_per_step` as groups per optimiser step
    (`training.token_budget.plan_token_budget`), the mean rollout length measured on the
    source episodes of `grpo` snapshot `dataset_id`'s tasks (of `templates`; the episode
    each task row was built from, up to `MEASURED_EPISODES`), rendered with `base_dir`'s
    tokenizer in `training.prompt_style`. An episode whose trajectory is no longer stored
    is skipped; with none left, or a snapshot without source episodes, the estimate
    `rl_rollout_tokens_estimate` is used. Logs which. None when no budget is set.

    Raises:
        SnapshotError: the snapshot is missing or corrupt.
        StorageError: a trajectory cannot be read (other than missing).
        TrainerError: the tokenizer cannot be loaded.
    """
    from training.trainers.common import load_tokenizer

    if training.rl_tokens_per_step is None:
        return None
    frame = read_snapshot(store, get_snapshot(engine, dataset_id))
    ids: list[str] = []
    if "episode_id" in frame.columns:
        for template, episode_id in frame.select("template", "episode_id").iter_rows():
            if episode_id and (not templates or template in templates):
                ids.append(str(episode_id))
    if len(ids) > MEASURED_EPISODES:
        stride = len(ids) / MEASURED_EPISODES
        ids = [ids[int(i * stride)] for i in range(MEASURED_EPISODES)]
    trajectories = []
    for episode_id in ids:
        try:
            trajectories.append(load_trajectory(engine, store, uuid.UUID(episode_id)))
        except ObjectNotFound:
            continue
    counts = (
        rollout_token_counts(trajectories, load_tokenizer(base_dir), training.prompt_style)
        if trajectories
        else []
    )
    budget = plan_token_budget(training, counts)
    if budget is not None:
        logger.info(budget.describe())
    return budget


def check_protocol_template(base_dir: Path, checkpoint_id: uuid.UUID) -> None:
    """Refuse a base whose chat template cannot render protocol v1 for GRPO
    (`training.protocol_template`), with the tokenizer the trainer would load.

    Raises:
        ChatTemplateError: it cannot (the message says why and what to start from).
    """
    from training.trainers.common import load_tokenizer

    problem = protocol_template_problem(load_tokenizer(base_dir))
    if problem is not None:
        raise ChatTemplateError(
            f"checkpoint {checkpoint_id} cannot train with agentic GRPO: its chat template "
            f"{problem}; start from a checkpoint whose chat template renders system, user "
            "and assistant turns (an epiflow base, an instruct model)",
            setting="--base-checkpoint",
        )


def check_base_checkpoint(
    engine: Engine, store: ObjectStore, checkpoint_id: uuid.UUID, scratch: Path
) -> None:
    """`check_protocol_template` on the stored checkpoint, its tokenizer files fetched
    into `scratch` without the weights: what `epiflow train --algo grpo --base-checkpoint`
    runs before its flow starts, so a base that cannot be trained is refused in one line.

    Raises:
        CheckpointNotFound, RegistryError: the checkpoint cannot be fetched.
        ChatTemplateError: its chat template cannot render protocol v1.
    """
    base_dir = fetch_checkpoint(engine, store, checkpoint_id, scratch / "base", weights=False)
    check_protocol_template(base_dir, checkpoint_id)


def train_grpo_model(
    engine: Engine,
    store: ObjectStore,
    *,
    dataset_id: uuid.UUID,
    work_dir: Path,
    training: TrainingSettings,
    settings: Settings,
    qc_config: QcConfig,
    base_checkpoint_id: uuid.UUID,
    templates: Sequence[str] | None = None,
    prefect_flow_run_id: str | None = None,
    on_metrics: MetricsHook | None = None,
    concurrency: int = 4,
    stop: threading.Event | None = None,
) -> TrainedModel:
    """Agentic GRPO from checkpoint `base_checkpoint_id` over the tasks of `grpo` snapshot
    `dataset_id` (see the module): the `training_run` row (running) and the trained model
    in `work_dir/model`, to be registered with `training.pipeline.register_checkpoint`.
    Setting `stop` (a caller that was cancelled) ends the training within a micro-batch,
    or at once while it waits for rollouts (`TrainingStopped`); a cancellation of the
    rollout run sets it too.

    Raises:
        TrainerError: not a `grpo` snapshot, no task, or the trainer failed.
        SnapshotError: the snapshot is missing or corrupt.
        RegistryError, CheckpointNotFound: the base checkpoint cannot be fetched.
        ChatTemplateError: its chat template cannot render protocol v1 (nothing opened).
        CollectError, StorageError: the rollout run cannot be opened or stored.
    """
    from collection.grpo_rollouts import run_grpo_rollouts
    from training.precision import rollout_dtype
    from training.trainers.episode_grpo import episode_grpo_settings, run_episode_grpo

    tasks = grpo_tasks(engine, store, dataset_id, settings, templates=templates)
    base_dir = fetch_checkpoint(engine, store, base_checkpoint_id, work_dir / "base")
    check_protocol_template(base_dir, base_checkpoint_id)
    budget = plan_rollout_budget(
        engine,
        store,
        dataset_id=dataset_id,
        base_dir=base_dir,
        training=training,
        templates=templates,
    )
    trained_with = episode_grpo_settings(training, budget)
    config = {**trained_with.model_dump(mode="json"), "rollouts": "episodes"}
    if budget is not None:
        config["token_budget"] = budget.as_config()
    run_id = start_training_run(
        engine,
        dataset_id=dataset_id,
        algo=Algo.GRPO.value,
        base_model=str(base_checkpoint_id),
        config=config,
        prefect_flow_run_id=prefect_flow_run_id,
    )
    job = TrainJob(
        base_model_dir=base_dir,
        output_dir=work_dir / "model",
        settings=training,
        on_metrics=on_metrics,
        stop=stop if stop is not None else threading.Event(),
    )
    task_ids = [t.task_id for t in tasks]
    try:
        result, _rollouts = run_grpo_rollouts(
            str(run_id),
            tasks,
            settings,
            lambda source: run_episode_grpo(
                task_ids, job, source, budget=budget, templates=[t.template for t in tasks]
            ),
            base_model_dir=base_dir,
            engine=engine,
            store=store,
            qc_config=qc_config,
            concurrency=concurrency,
            prompt_style=training.prompt_style,
            temperature=training.temperature,
            max_new_tokens=training.max_completion_length,
            generation_dtype=rollout_dtype(training),
            batch_window_s=training.rollout_batch_window_s,
            training_run_id=run_id,
            stop=job.stop,
        )
    except BaseException as e:  # cancelled or interrupted runs are closed too
        fail_training_run(engine, run_id, error=f"{type(e).__name__}: {e}")
        raise
    return TrainedModel(
        training_run_id=run_id,
        dataset_id=dataset_id,
        algo=Algo.GRPO,
        base_name=str(base_checkpoint_id),
        base_checkpoint_id=base_checkpoint_id,
        result=result,
        settings=trained_with if budget is not None else None,
        token_budget=budget,
    )
