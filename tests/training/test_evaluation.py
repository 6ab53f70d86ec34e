"""Evaluation metrics, and training's rendering checked against a real episode's recorded history."""

from __future__ import annotations

import asyncio

from agent.loop import run_episode
from agent.policies import make_policy
from agent.settings import LoopSettings
from agent.trajectory import EpisodeStatus, history_hash
from sandbox import SandboxSpec
from suites.registry import load_suite
from tests.training.factory import call_step, episode, final_step, garbage_step
from training.conversations import episode_messages
from training.evaluation import compare_metrics, evaluation_metrics


def test_metrics_of_hand_built_episodes():
    ok = episode(task=1, steps=[call_step(0, "ls"), final_step(1)])
    bad = episode(
        task=2,
        success=False,
        steps=[
            call_step(0, "cat nope", exit_code=1),
            garbage_step(1),
            call_step(2, "ls"),
            final_step(3),
        ],
    )
    m = evaluation_metrics([ok, bad])
    assert m.completion_rate == 0.5
    assert m.avg_steps == 3.0
    assert m.n_acting_turns == 4  # finals do not count
    assert m.tool_failure_rate == 0.5  # the failed cat and the garbage turn
    assert evaluation_metrics([]).n_episodes == 0
    assert compare_metrics(m, None) == {}
    assert compare_metrics(m, m) == {
        "completion_rate": 0.0,
        "avg_steps": 0.0,
        "tool_failure_rate": 0.0,
    }


def test_training_renders_exactly_the_history_the_loop_sent():
    """Seed 000 §4.5: each step's recorded history hash equals the hash of training's messages."""
    task = load_suite("builtin").instances(1, templates=["csv_to_json"])[0]
    traj = asyncio.run(
        run_episode(
            task,
            make_policy("scripted:oracle"),
            spec=SandboxSpec(),
            run_key="render-check",
            settings=LoopSettings(),
        )
    )
    assert traj.status == EpisodeStatus.SUCCESS and traj.n_steps >= 2
    messages = episode_messages(traj)
    assistant_positions = [i for i, m in enumerate(messages) if m["role"] == "assistant"]
    assert len(assistant_positions) == traj.n_steps
    for step, position in zip(traj.steps, assistant_positions, strict=True):
        assert history_hash(messages[:position]) == step.history_hash
