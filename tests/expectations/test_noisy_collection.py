"""The gate on real collections: built-in tasks, scripted policies, the real loop, real nsjail.

No database and no Prefect: episodes are collected in-process with `agent.loop.run_episode`
(one jail per episode, verifier inside the jail) and handed to `expectations.gate.run_gate`.
The `scripted:noisy` policy labels each perturbed step (`Step.policy_perturbation`); the
gate never reads that label, the test uses it to check each kind lands where the seed's
table says. Skips with a reason when nsjail cannot start here.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from agent.loop import run_episode
from agent.policies.scripted import PERTURBATION_KINDS, NoisyPolicy, OraclePolicy
from agent.settings import LoopSettings, NoisyRates
from agent.trajectory import EpisodeStatus, Trajectory
from config.settings import load_qc_config
from expectations.gate import run_gate
from sandbox import SandboxSettings, sandbox_opener
from sandbox.errors import SandboxUnavailable
from sandbox.spec import SandboxSpec
from suites.builtin import builtin_suite
from tasks.types import TaskInstance

pytestmark = pytest.mark.slow

FORMAT_DISCARDS = {
    "format.parse_error_majority",
    "format.unrecovered_parse_error",
    "format.ended_on_parse_failures",
}


def collect(jobs: list[tuple[TaskInstance, Any, int]], **kw: Any) -> list[Trajectory]:
    kw.setdefault("open_sandbox", sandbox_opener(SandboxSettings()))

    async def go() -> list[Trajectory]:
        spec, settings = SandboxSpec(), LoopSettings()
        out = []
        for task, policy, rollout in jobs:
            out.append(
                await run_episode(
                    task,
                    policy,
                    spec=spec,
                    run_key="qc",
                    settings=settings,
                    rollout_index=rollout,
                    **kw,
                )
            )
        return out

    trajectories = asyncio.run(go())
    for t in trajectories:
        if (
            t.status is EpisodeStatus.ENV_ERROR
            and "unavailable" in (t.failure_reason or "")
            and not kw
        ):
            pytest.skip(f"nsjail cannot start here: {t.failure_reason}")
    return trajectories


def kinds_of(t: Trajectory) -> set[str]:
    return {s.policy_perturbation for s in t.steps if s.policy_perturbation is not None}


@pytest.fixture(scope="module")
def tasks() -> list[TaskInstance]:
    return builtin_suite().instances(1, seed=0)


def test_noisy_collection_lands_in_the_seed_verdicts(tasks: list[TaskInstance]) -> None:
    jobs: list[tuple[TaskInstance, Any, int]] = [(t, OraclePolicy(), 0) for t in tasks]
    zero: dict[str, Any] = dict.fromkeys(PERTURBATION_KINDS, 0.0)
    for i, kind in enumerate(PERTURBATION_KINDS):
        policy = NoisyPolicy(NoisyRates(**{**zero, kind: 0.35}))
        jobs += [(t, policy, 1 + 10 * i + j) for j, t in enumerate(tasks[:5])]
    episodes = collect(jobs)
    config = load_qc_config()
    report = run_gate(episodes, config=config)
    assert report.batch_passed, report.batch_failures
    rows = {r["episode_id"]: r for r in report.verdicts.iter_rows(named=True)}
    seen: set[str] = set()
    for t in episodes:
        row = rows[str(t.episode_id)]
        reasons, verdict, sign = set(row["reasons"]), row["verdict"], row["reward_sign"]
        kinds = kinds_of(t)
        where = (t.template, sorted(kinds), verdict, sorted(reasons))
        if not kinds:  # the oracle, or a noisy episode whose draws never fired
            assert (verdict, sign, reasons) == ("keep", 1, set()), where
            continue
        [kind] = kinds
        seen.add(kind)
        if kind in ("malformed", "unknown_tool", "missing_arg", "mistyped_arg", "fabricated_claim"):
            # Recovered blemishes downweight; a majority of broken messages discards.
            assert "format.recovered_parse_error" in reasons, where
            assert verdict == ("discard" if reasons & FORMAT_DISCARDS else "downweight"), where
            if kind == "fabricated_claim":
                assert "logic.fabricated_claim" in reasons, where
        elif kind == "premature_final":
            assert (verdict, sign) == ("keep", -1) and "result.negative_reward" in reasons, where
        elif kind == "repeated_command":
            assert verdict == "downweight" and "efficiency.repeated_call" in reasons, where
        elif kind == "skipped_step":
            # Skipping a read shows as a write before its input; skipping a needed write fails the task.
            assert (
                verdict == "downweight" and "logic.write_before_read" in reasons
            ) or sign == -1, where
    assert seen == set(PERTURBATION_KINDS)


def test_broken_sandbox_fails_the_batch(tasks: list[TaskInstance]) -> None:
    healthy = collect([(t, OraclePolicy(), 0) for t in tasks[:5]])

    async def broken_opener(*args: Any, **kw: Any) -> Any:
        raise SandboxUnavailable("forced: jail pool exhausted")

    broken = collect([(t, OraclePolicy(), 1) for t in tasks[:2]], open_sandbox=broken_opener)
    assert all(t.status is EpisodeStatus.ENV_ERROR for t in broken)
    report = run_gate([*healthy, *broken], config=load_qc_config())
    assert not report.batch_passed
    assert [c.expectation for c in report.batch_failures] == ["environment.error_rate"]
    rows = {r["episode_id"]: r for r in report.verdicts.iter_rows(named=True)}
    assert {rows[str(t.episode_id)]["verdict"] for t in broken} == {"discard"}
    assert {rows[str(t.episode_id)]["verdict"] for t in healthy} == {"keep"}
