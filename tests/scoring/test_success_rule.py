"""One success rule: the episode's status (the loop), its final reward (scoring), the rule
judge's false-claim check and the QC feature `success` all decide "success" with
`agent.settings.SuccessSettings`, read from one variable, so they agree at the threshold."""

from __future__ import annotations

import asyncio

import pytest
from pydantic import ValidationError

from agent.loop import run_episode
from agent.settings import LoopSettings, SuccessSettings
from agent.trajectory import EpisodeStatus, Trajectory
from sandbox.interface import Sandbox
from sandbox.spec import SandboxSpec
from scoring.rewards import apply_rewards
from scoring.rule_judge import judge_trajectory
from scoring.settings import RewardSettings, RuleJudgeSettings
from tasks.types import TaskInstance
from tasks.verify import VerifierOutcome
from tests.agent.conftest import MemoryOpener, make_copy_task
from tests.agent.doubles import ScriptedTextPolicy

THRESHOLD = 0.75
JUST_BELOW = 0.7499999999


def _episode(score: float, success: SuccessSettings) -> Trajectory:
    async def verify(sandbox: Sandbox, task: TaskInstance) -> VerifierOutcome:
        return VerifierOutcome(score=score, reason=f"scored {score}")

    spec = SandboxSpec(
        memory_mib=512, pids=64, tmpfs_mib=32, workspace_mib=64, inodes=4096, call_timeout_s=10
    )
    return asyncio.run(
        run_episode(
            make_copy_task(),
            # A success claim: the judge flags it exactly when the episode is no success.
            ScriptedTextPolicy(["The task is done.\n<final>done</final>"]),
            spec=spec,
            run_key="success-rule",
            settings=LoopSettings(max_steps=12, success=success),
            open_sandbox=MemoryOpener(),
            verify=verify,
        )
    )


@pytest.mark.parametrize(("score", "succeeds"), [(THRESHOLD, True), (JUST_BELOW, False)])
def test_status_and_reward_agree_at_the_threshold(score: float, succeeds: bool) -> None:
    success = SuccessSettings(threshold=THRESHOLD)
    rewards = RewardSettings(success=success)
    traj = apply_rewards(_episode(score, success), rewards)
    assert traj.verifier_score == score
    assert (traj.status == EpisodeStatus.SUCCESS) is succeeds, traj.failure_reason
    assert (traj.final_reward == rewards.success_reward) is succeeds, traj.final_reward
    judgement = judge_trajectory(traj, RuleJudgeSettings(success=success))
    false_claims = [d for d in judgement.deductions if d.code == "false_final_claim"]
    assert bool(false_claims) is not succeeds


def test_one_variable_sets_the_threshold_of_status_reward_and_judge(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("EPIFLOW_SUCCESS_THRESHOLD", "0.5")
    thresholds = {
        LoopSettings().success.threshold,
        RewardSettings().success.threshold,
        RuleJudgeSettings().success.threshold,
    }
    assert thresholds == {0.5}


@pytest.mark.parametrize("threshold", [0.0, -0.1, 1.01])
def test_the_threshold_is_in_the_half_open_unit_interval(threshold: float) -> None:
    # 0 would make a verifier that did not run (no score) or scored 0 a success.
    with pytest.raises(ValidationError):
        SuccessSettings(threshold=threshold)


def test_no_score_is_never_a_success() -> None:
    assert not SuccessSettings(threshold=0.01).is_success(None)
    assert SuccessSettings(threshold=0.01).is_success(0.01)
