"""Stopping agentic GRPO while it waits for rollouts in real jails: asked to stop (a cancelled
flow sets `stop`) or cancelled on its event loop (Ctrl-C or SIGTERM in a command), the
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
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine

from agent.policies.base import Policy, PolicyRequest, PolicyResponse
from collection.grpo_rollouts import CollectionRolloutSource, rollout_run_key, run_grpo_rollouts
from config.settings import load_qc_config
from models import run_id_for
from storage.objects import LocalObjectStore
from storage.run_reads import run_status
from suites.builtin import builtin_suite
from tasks.types import TaskInstance
from tests.services.processes import descendants
from tests.training.grpo_setup import rollout_settings, tiny_grpo_training
from training.errors import TrainingStopped
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


def _jails_left(within_s: float = 10.0) -> list[int]:
    """The live nsjail processes still descending from this one after up to `within_s`
    (a jail's close is a signal; its process ends a moment later)."""
    deadline = time.monotonic() + within_s
    while (left := _jails()) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def _jails() -> list[int]:
    """The live (not zombie) nsjail processes descending from this one."""
    live = []
    for pid in descendants(os.getpid()):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        name, state = stat[stat.index("(") + 1 : stat.rindex(")")], stat[stat.rindex(")") + 2]
        if name == "nsjail" and state != "Z":
            live.append(pid)
    return live


@dataclasses.dataclass
class _Run:
    """GRPO on two tasks × 2 rollouts with the blocking policy, in real jails."""

    key: str
    job: TrainJob
    asked: threading.Event
    tiny_base_model: Path
    engine: Engine
    store: LocalObjectStore
    tasks: list[TaskInstance] = dataclasses.field(
        default_factory=lambda: builtin_suite().instances(1, templates=["dir_tree", "checksums"])
    )

    def train(self, source: CollectionRolloutSource) -> Any:
        return run_episode_grpo([t.task_id for t in self.tasks], self.job, source)

    def __call__(
        self, train: Callable[[CollectionRolloutSource], Any], stop: threading.Event | None = None
    ) -> Any:
        return run_grpo_rollouts(
            self.key,
            self.tasks,
            rollout_settings(max_steps=3, policy_timeout_s=300, episode_timeout_s=300),
            train,
            base_model_dir=self.tiny_base_model,
            engine=self.engine,
            store=self.store,
            qc_config=load_qc_config(),
            concurrency=4,
            make_policy=lambda batch: _Blocking(self.asked),
            stop=stop,
        )


def _run(
    name: str,
    tiny_base_model: Path,
    engine: Engine,
    store: LocalObjectStore,
    tmp_path: Path,
    stop: threading.Event | None = None,
) -> _Run:
    training = tiny_grpo_training(max_steps=2, batch_size=4, rollouts_per_task=2)
    job = TrainJob(
        base_model_dir=tiny_base_model, output_dir=tmp_path / "rl", settings=training, stop=stop
    )
    key = f"test-{name}-{uuid.uuid4().hex[:8]}"
    return _Run(key, job, threading.Event(), tiny_base_model, engine, store)


def test_a_stop_asked_while_rollouts_run_ends_the_training_and_its_jails(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, tmp_path: Path
) -> None:
    stop = threading.Event()
    run = _run("stop", tiny_base_model, engine, store, tmp_path, stop)
    stopped_at: list[float] = []

    def stop_when_asked() -> None:
        if run.asked.wait(300):
            stopped_at.append(time.monotonic())
            stop.set()

    threading.Thread(target=stop_when_asked, daemon=True).start()
    with pytest.raises(TrainingStopped, match="asked to stop"):
        run(run.train, stop)
    assert stopped_at and time.monotonic() - stopped_at[0] < STOPPED_WITHIN_S
    # A stop is not a failure: the rollout run says it was interrupted.
    assert run_status(engine, run_id_for(rollout_run_key(run.key))) == "interrupted"
    assert _jails_left() == []


def test_a_cancelled_rollout_run_waits_for_its_training_thread(
    tiny_base_model: Path, engine: Engine, store: LocalObjectStore, tmp_path: Path
) -> None:
    run = _run("cancel", tiny_base_model, engine, store, tmp_path)
    sources: list[CollectionRolloutSource] = []
    trained: dict[str, Any] = {}

    def train(source: CollectionRolloutSource) -> Any:
        sources.append(source)
        run.job = dataclasses.replace(run.job, stop=source.stop)
        try:
            return run.train(source)
        except BaseException as e:
            trained["raised"] = e
            raise
        finally:
            trained["ended_at"] = time.monotonic()

    def rollouts() -> None:
        try:
            run(train)
        except BaseException as e:
            trained["run_raised"] = e
        finally:
            trained["returned_at"] = time.monotonic()

    runner = threading.Thread(target=rollouts, daemon=True)
    runner.start()
    assert run.asked.wait(300), "no rollout episode started"
    assert _jails(), "the rollouts' jails run while the policy is asked"
    loop = sources[0].loop
    assert loop is not None
    cancelled_at = time.monotonic()
    # What Ctrl-C or SIGTERM does to a command (`cli.interrupts.run_interruptibly`): its
    # main task is cancelled (`run_grpo_rollouts`' `main`), the rest unwinds from there.

    def cancel_main() -> None:
        (main,) = [t for t in asyncio.all_tasks() if t.get_coro().__name__ == "main"]  # type: ignore[union-attr]
        main.cancel()

    loop.call_soon_threadsafe(cancel_main)
    runner.join(STOPPED_WITHIN_S)
    assert not runner.is_alive(), "the cancelled run did not return: a thread outlived it"
    assert isinstance(trained["run_raised"], asyncio.CancelledError)
    assert isinstance(trained["raised"], TrainingStopped)
    assert trained["ended_at"] <= trained["returned_at"]  # waited for, not left behind
    assert trained["returned_at"] - cancelled_at < STOPPED_WITHIN_S
    assert run_status(engine, run_id_for(rollout_run_key(run.key))) == "interrupted"
    assert _jails_left() == []
