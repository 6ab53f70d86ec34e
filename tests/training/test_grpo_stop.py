"""Stopping agentic GRPO while it waits for rollouts in real jails: asked to stop (a cancelled
flow sets `stop`) or cancelled on its event loop (SIGTERM in `bench/loop.py`, Ctrl-C), the
training thread ends within seconds, the rollout run is `interrupted`, no jail is left.

Before, a cancelled run waited at exit for a training thread that itself waited for rollouts
on the event loop being shut down: the process hung. The policy here blocks until cancelled,
so the stop always lands while a batch's episodes are running (the tiny model and its
trainer are real; only what the policy answers is not)."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from agent.prompt import PromptStyle
from agent.settings import LoopSettings, PolicySettings
from collection.grpo_rollouts import CollectionRolloutSource, rollout_run_key, run_grpo_rollouts
from config.settings import load_qc_config, load_settings
from models import run_id_for
from storage.objects import LocalObjectStore
from storage.run_reads import run_status
from suites.builtin import builtin_suite
from training.errors import TrainingStopped
from training.settings import TrainingSettings
from training.trainers.common import TrainJob
from training.trainers.episode_grpo import run_episode_grpo

STOPPED_WITHIN_S = 60.0
"""The stop must end the run well before the blocked episodes' own timeouts (300 s)."""


class _Blocking(Policy):
    """Answers nothing until cancelled; says when the first episode asked."""

    spec = "test:blocking"

    def __init__(self, asked: threading.Event) -> None:
        self.asked = asked

    async def respond(self, request: PolicyRequest) -> PolicyResponse:
        self.asked.set()
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def _jails() -> list[int]:
    """The nsjail processes descending from this one (from /proc)."""
    parents: dict[int, tuple[int, str]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:  # gone meanwhile
            continue
        comm = stat[stat.index("(") + 1 : stat.rindex(")")]
        parents[int(entry.name)] = (int(stat[stat.rindex(")") + 2 :].split()[1]), comm)
    ours = {os.getpid()}
    grew = True
    while grew:
        found = {pid for pid, (ppid, _) in parents.items() if ppid in ours} - ours
        grew = bool(found)
        ours |= found
    return [pid for pid in ours if parents.get(pid, (0, ""))[1] == "nsjail"]


def _setup(tiny_base_model: Path, tmp_path: Path, stop: threading.Event | None) -> Any:
    tasks = builtin_suite().instances(1, templates=["dir_tree", "checksums"])
    settings = dataclasses.replace(
        load_settings(),
        loop=LoopSettings(max_steps=3, policy_timeout_s=300, episode_timeout_s=300),
        policy=PolicySettings(outage_episodes=0),
    )
    training = TrainingSettings(
        vocab_size=4096,
        max_length=1024,
        max_position_embeddings=1024,
        max_steps=2,
        batch_size=4,
        rollouts_per_task=2,
        max_completion_length=16,
        prompt_style=PromptStyle.COMPACT,
        logging_steps=1,
    )
    job = TrainJob(
        base_model_dir=tiny_base_model, output_dir=tmp_path / "rl", settings=training, stop=stop
    )
    return tasks, settings, job


def test_a_stop_asked_while_rollouts_run_ends_the_training_and_its_jails(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, tmp_path: Path
) -> None:
    stop = threading.Event()
    asked = threading.Event()
    tasks, settings, job = _setup(tiny_base_model, tmp_path, stop)
    key = f"test-stop-{uuid.uuid4().hex[:8]}"
    stopped_at: list[float] = []

    def stop_when_asked() -> None:
        if asked.wait(300):
            stopped_at.append(time.monotonic())
            stop.set()

    threading.Thread(target=stop_when_asked, daemon=True).start()
    with pytest.raises(TrainingStopped, match="asked to stop"):
        run_grpo_rollouts(
            key,
            tasks,
            settings,
            lambda source: run_episode_grpo([t.task_id for t in tasks], job, source),
            base_model_dir=tiny_base_model,
            engine=engine,
            store=store,
            qc_config=load_qc_config(),
            concurrency=4,
            make_policy=lambda batch: _Blocking(asked),
            stop=stop,
        )
    assert stopped_at and time.monotonic() - stopped_at[0] < STOPPED_WITHIN_S
    # A stop is not a failure: the rollout run says it was interrupted.
    assert run_status(engine, run_id_for(rollout_run_key(key))) == "interrupted"
    assert _jails() == []


def test_a_cancelled_rollout_run_waits_for_its_training_thread(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, tmp_path: Path
) -> None:
    asked = threading.Event()
    tasks, settings, job = _setup(tiny_base_model, tmp_path, None)
    key = f"test-cancel-{uuid.uuid4().hex[:8]}"
    sources: list[CollectionRolloutSource] = []
    trained: dict[str, Any] = {}

    def train(source: CollectionRolloutSource) -> Any:
        sources.append(source)
        try:
            return run_episode_grpo(
                [t.task_id for t in tasks], dataclasses.replace(job, stop=source.stop), source
            )
        except BaseException as e:
            trained["raised"] = e
            raise
        finally:
            trained["ended_at"] = time.monotonic()

    def run() -> None:
        try:
            run_grpo_rollouts(
                key,
                tasks,
                settings,
                train,
                base_model_dir=tiny_base_model,
                engine=engine,
                store=store,
                qc_config=load_qc_config(),
                concurrency=4,
                make_policy=lambda batch: _Blocking(asked),
            )
        except BaseException as e:
            trained["run_raised"] = e
        finally:
            trained["returned_at"] = time.monotonic()

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    assert asked.wait(300), "no rollout episode started"
    assert _jails(), "the rollouts' jails run while the policy is asked"
    loop = sources[0].loop
    assert loop is not None
    cancelled_at = time.monotonic()
    # What a signal does to `asyncio.run` (SIGTERM in bench/loop.py): every task cancelled.
    loop.call_soon_threadsafe(lambda: [t.cancel() for t in asyncio.all_tasks()])
    runner.join(STOPPED_WITHIN_S)
    assert not runner.is_alive(), "the cancelled run did not return: a thread outlived it"
    assert isinstance(trained["run_raised"], asyncio.CancelledError)
    assert isinstance(trained["raised"], TrainingStopped)
    assert trained["ended_at"] <= trained["returned_at"]  # waited for, not left behind
    assert trained["returned_at"] - cancelled_at < STOPPED_WITHIN_S
    assert run_status(engine, run_id_for(rollout_run_key(key))) == "interrupted"
    assert _jails() == []
