"""GRPO rewards: the protocol parser's verdict, and real sandboxes with the task's verifier."""

from __future__ import annotations

import pytest

from agent.render import render_final, render_tool_call
from suites.registry import load_suite
from training.rewards import ProtocolReward, SandboxReward, completion_text, suite_task_resolver
from training.settings import TrainingSettings


def _as_chat(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


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
    task = load_suite("builtin").instances(1, templates=["csv_to_json"])[0]
    resolve = suite_task_resolver()
    assert resolve(task.suite, task.template, task.seed, task.task_id) == task
    with pytest.raises(ValueError, match="suite changed"):
        resolve(task.suite, task.template, task.seed, task.task_id + "x")


def test_sandbox_reward_runs_the_turn_and_the_verifier_in_nsjail():
    """The reference write solves csv_to_json in one turn; garbage and a bare final do not."""
    settings = TrainingSettings()
    task = load_suite("builtin").instances(1, templates=["csv_to_json"])[0]
    write = task.reference_solution[-1]
    solving = render_tool_call("c1", write.tool, write.args, preamble="Writing the JSON.\n")
    wrong = render_tool_call("c1", "write_file", {"path": "other.json", "content": "[]"})
    completions = [
        _as_chat(solving),
        _as_chat(wrong),
        _as_chat(render_final("done")),
        _as_chat("no idea"),
    ]
    columns = {
        "task_id": [task.task_id] * 4,
        "suite": [task.suite] * 4,
        "template": [task.template] * 4,
        "instance_seed": [task.seed] * 4,
    }
    scores = SandboxReward(settings)([None] * 4, completions, **columns)
    w = settings.step_reward_weight
    assert scores[0] == pytest.approx(1.0 + w)
    assert scores[1] < scores[0] and scores[2] < scores[0]
    assert scores[3] == pytest.approx(settings.failure_reward)
    assert min(scores[1], scores[2]) >= settings.failure_reward
