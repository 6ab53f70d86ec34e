"""Hand-built, protocol-exact trajectories for the training tests (no model involved)."""

from __future__ import annotations

from datetime import timedelta

from agent.render import render_final, render_tool_call, render_tool_error
from agent.trajectory import (
    EpisodeStatus,
    FailureCategory,
    ParseKind,
    Step,
    Trajectory,
    episode_id_for,
    utcnow,
)
from sandbox.tool_specs import BUILTIN_TOOLS
from scoring.rewards import apply_rewards
from scoring.settings import RewardSettings

TOOL_VERSIONS = {name: spec.version for name, spec in BUILTIN_TOOLS.items()}


def call_step(index: int, command: str, *, output: str = "ok\n", exit_code: int = 0) -> Step:
    call_id = f"c{index + 1}"
    raw = render_tool_call(call_id, "execute_shell", {"command": command}, preamble="Running it.\n")
    observation = f'<tool_result id="{call_id}" name="execute_shell" exit_code="{exit_code}">{output}</tool_result>'
    return Step(
        index=index,
        history_hash=f"{index:064x}",
        raw_output=raw,
        parse_kind=ParseKind.TOOL_CALL,
        call_id=call_id,
        tool="execute_shell",
        args={"command": command},
        observation=observation,
        exit_code=exit_code,
        stdout=output,
    )


def garbage_step(index: int, text: str = "hmm, let me think") -> Step:
    return Step(
        index=index,
        history_hash=f"{index:064x}",
        raw_output=text,
        parse_kind=ParseKind.NONE,
        parse_error="no block",
        parse_error_code="no_block",
        observation=render_tool_error("no block", code="no_block"),
    )


def final_step(index: int, text: str = "done") -> Step:
    return Step(
        index=index,
        history_hash=f"{index:064x}",
        raw_output=render_final(text),
        parse_kind=ParseKind.FINAL,
        final_answer=text,
    )


def episode(
    *,
    run_key: str = "train-run",
    task: int = 0,
    rollout: int = 0,
    success: bool = True,
    steps: list[Step] | None = None,
    policy: str = "scripted:oracle",
    template: str = "csv_to_json",
) -> Trajectory:
    """An episode of task `task`; by default `cat data.csv` then a final answer."""
    task_id = f"builtin/{template}@1#{task}-{task:010x}"
    body = steps if steps is not None else [call_step(0, "cat data.csv"), final_step(1)]
    start = utcnow()
    return Trajectory(
        episode_id=episode_id_for(run_key, task_id, rollout),
        run_key=run_key,
        task_id=task_id,
        rollout_index=rollout,
        suite="builtin",
        suite_version="1",
        template=template,
        instance_seed=task,
        prompt=f"Convert data{task}.csv to out.json",
        policy=policy,
        tool_versions=TOOL_VERSIONS,
        sandbox_spec_hash="0" * 16,
        started_at=start,
        ended_at=start + timedelta(seconds=2),
        status=EpisodeStatus.SUCCESS if success else EpisodeStatus.FAILED,
        failure_category=FailureCategory.SUCCESS if success else FailureCategory.VERIFIER_FAILED,
        verifier_score=1.0 if success else 0.0,
        steps=body,
    )


def tokened_episode(
    *, task: int, rollout: int, success: bool, sampled: int, template: str = "csv_to_json"
) -> Trajectory:
    """A rewarded two-turn episode (`ls`, then a final answer) with the token ids and
    logprobs a policy recorded: turn 0's prompt `[1, 2, 3]` and sampled `[sampled, 9]`;
    turn 1's prompt extends it with the observation `[50, 51]`, sampled `[sampled + 1, 9]`;
    logprobs -1 and -2 each turn."""
    p0 = [1, 2, 3]
    p1 = [*p0, sampled, 9, 50, 51]
    t = episode(
        task=task,
        rollout=rollout,
        success=success,
        template=template,
        steps=[call_step(0, "ls"), final_step(1)],
    )
    for step, prompt, ids in zip(t.steps, (p0, p1), ([sampled, 9], [sampled + 1, 9]), strict=True):
        step.prompt_token_ids, step.completion_token_ids, step.logprobs = prompt, ids, [-1.0, -2.0]
    return apply_rewards(t, RewardSettings())
