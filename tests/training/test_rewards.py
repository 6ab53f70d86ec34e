"""GRPO rewards: the protocol parser's verdict, and real sandboxes with the task's verifier."""

from __future__ import annotations

import asyncio
import uuid
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine
from sqlmodel import Session

from agent.render import render_final, render_tool_call
from agent.settings import LoopSettings, SuccessSettings
from agent.trajectory import Trajectory
from models import Episode
from sandbox.settings import SandboxSettings
from scoring.rewards import final_reward
from scoring.settings import RewardSettings
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from suites.builtin import builtin_suite
from suites.settings import SuitesSettings
from tasks.types import TaskInstance
from training.rewards import (
    ProtocolReward,
    SandboxReward,
    completion_text,
    rollout_loop,
    suite_task_resolver,
)


def _as_chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def _sandbox_reward(rewards: RewardSettings) -> SandboxReward:
    """GRPO's sandbox reward with this test's settings (the test is the entry point)."""
    return SandboxReward(
        rewards, loop=LoopSettings(), sandbox=SandboxSettings(), suites=SuitesSettings()
    )


def test_a_rollout_is_one_turn_of_the_entry_points_loop():
    loop = LoopSettings(policy_timeout_s=7.0, max_steps=30)
    rollout = rollout_loop(loop)
    assert (rollout.max_steps, rollout.max_consecutive_parse_failures) == (1, 1)
    assert rollout.policy_timeout_s == 7.0 and rollout.verify_after_limits
    assert loop.max_steps == 30  # the entry point's own settings are not changed
    assert _sandbox_reward(RewardSettings()).loop == rollout_loop(LoopSettings())


def test_protocol_reward_grades_format():
    reward = ProtocolReward()
    call = render_tool_call("c1", "list_dir", {"path": "/workspace"})
    unknown = render_tool_call("c1", "launch_rockets", {"n": "3"})
    scores = reward(
        [None] * 4,
        [_as_chat(call), _as_chat(render_final("ok")), _as_chat("just text"), _as_chat(unknown)],
    )
    assert scores == [1.0, 1.0, 0.0, -1.0]


def test_completion_text_accepts_strings_and_chats():
    assert completion_text("abc") == "abc"
    assert completion_text(_as_chat("abc")) == "abc"


def test_resolver_refuses_a_changed_task():
    task = builtin_suite().instances(1, templates=["csv_to_json"])[0]
    resolve = suite_task_resolver(SuitesSettings(), SandboxSettings())
    assert resolve(task.suite, task.template, task.seed, task.task_id) == task
    with pytest.raises(ValueError, match="suite changed"):
        resolve(task.suite, task.template, task.seed, task.task_id + "x")


def _rollouts(task: TaskInstance) -> tuple[list[str], dict[str, list[Any]]]:
    """The reference write (solves csv_to_json in one turn), a wrong write, a bare final, garbage."""
    write = task.reference_solution[-1]
    texts = [
        render_tool_call("c1", write.tool, write.args, preamble="Writing the JSON.\n"),
        render_tool_call("c1", "write_file", {"path": "other.json", "content": "[]"}),
        render_final("done"),
        "no idea",
    ]
    columns: dict[str, list[Any]] = {
        "task_id": [task.task_id] * 4,
        "suite": [task.suite] * 4,
        "template": [task.template] * 4,
        "instance_seed": [task.seed] * 4,
    }
    return texts, columns


def test_sandbox_reward_runs_the_turn_and_the_verifier_in_nsjail():
    rewards = RewardSettings()
    task = builtin_suite().instances(1, templates=["csv_to_json"])[0]
    texts, columns = _rollouts(task)
    scores = _sandbox_reward(rewards)([None] * 4, [_as_chat(t) for t in texts], **columns)
    # Solved: the success reward plus the step's shaping (parsed, a new path written).
    assert scores[0] == pytest.approx(
        rewards.success_reward + rewards.format_ok_reward + rewards.new_path_reward
    )
    assert scores[1] < scores[0] and scores[2] < scores[0]
    # Garbage: the failure reward plus the format penalty.
    assert scores[3] == pytest.approx(rewards.failure_reward + rewards.format_error_penalty)


def test_the_reward_grpo_optimises_is_the_reward_stored_with_the_episode(
    migrated_engine: Engine, tmp_path: Path
) -> None:
    """GRPO's reward of a turn is the stored reward of that turn's episode: the final reward
    stored with it is `scoring.rewards.final_reward` (the one formula) of its verifier
    score, and the GRPO reward is that plus the stored step shaping — nothing else."""
    rewards = RewardSettings(failure_reward=-0.4, success=SuccessSettings(threshold=0.9))
    task = builtin_suite().instances(1, templates=["csv_to_json"])[0]
    texts, columns = _rollouts(task)
    grpo = _sandbox_reward(rewards)
    optimised = grpo([None] * 4, [_as_chat(t) for t in texts], **columns)

    async def rollout_episodes() -> list[Trajectory]:
        return list(await asyncio.gather(*(grpo.episode(task, t) for t in texts)))

    episodes = [
        e.model_copy(update={"episode_id": uuid.uuid4()}) for e in asyncio.run(rollout_episodes())
    ]
    persist_episodes(migrated_engine, LocalObjectStore(tmp_path / "objects"), episodes)
    with Session(migrated_engine) as session:
        for reward, episode in zip(optimised, episodes, strict=True):
            row = session.get(Episode, episode.episode_id)
            assert row is not None and row.final_reward is not None
            assert row.final_reward == pytest.approx(final_reward(row.verifier_score, rewards))
            shaping = sum(step.immediate_reward or 0.0 for step in episode.steps)
            assert reward == pytest.approx(row.final_reward + shaping)
            assert reward == pytest.approx(row.total_reward)
    assert [e.final_reward for e in episodes] == pytest.approx([1.0, -0.4, -0.4, -0.4])
