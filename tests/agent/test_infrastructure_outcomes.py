"""Infrastructure outcomes (`env_error`, `storage_error`, `endpoint_error`) say nothing about
the agent: out of every success rate, no reward, and the outage rule that stops a run
whose endpoint is down (issue 22 item 3). Pure functions on real values."""

from __future__ import annotations

import polars as pl

from agent.outage import EndpointOutage
from agent.trajectory import INFRASTRUCTURE_STATUSES, EpisodeStatus, success_rate
from scoring.rewards import apply_rewards
from scoring.settings import RewardSettings
from storage.run_reads import summarize_frames
from tests.storage.builders import make_trajectory


def test_success_rate_leaves_infrastructure_out() -> None:
    assert success_rate({"success": 1, "failed": 1, "endpoint_error": 6, "env_error": 2}) == 0.5
    assert success_rate({"endpoint_error": 3}) == 0.0
    assert success_rate({}) == 0.0
    assert {str(s) for s in INFRASTRUCTURE_STATUSES} == {
        "env_error",
        "storage_error",
        "endpoint_error",
    }


def test_the_run_summary_leaves_infrastructure_out() -> None:
    episodes = pl.DataFrame(
        {
            "template": ["a", "a", "a", "b"],
            "status": ["success", "endpoint_error", "failed", "endpoint_error"],
            "failure_category": ["success", "endpoint_error", "max_steps", "endpoint_error"],
            "n_steps": [2, 1, 3, 1],
            "duration_ms": [10.0, 20.0, 30.0, 40.0],
        }
    )
    calls = pl.DataFrame(
        {"tool": [], "calls": [], "failed": []},
        schema={"tool": pl.String, "calls": pl.Int64, "failed": pl.Int64},
    )
    summary = summarize_frames(episodes, calls)
    assert summary.episodes == 4 and summary.by_status["endpoint_error"] == 2
    assert summary.success_rate == 0.5
    assert summary.success_rate_by_template == {"a": 0.5}


def test_an_endpoint_error_gets_no_reward() -> None:
    base = make_trajectory()
    trajectory = base.model_copy(update={"status": EpisodeStatus.ENDPOINT_ERROR})
    rewarded = apply_rewards(trajectory, RewardSettings())
    assert rewarded.final_reward is None and rewarded.total_reward is None
    assert all(s.immediate_reward == 0.0 and s.return_ == 0.0 for s in rewarded.steps)
    failed = apply_rewards(
        base.model_copy(update={"status": EpisodeStatus.FAILED}), RewardSettings()
    )
    assert failed.final_reward is not None


def test_the_outage_rule_trips_once_on_a_streak() -> None:
    outage = EndpointOutage(limit=2)
    down, ok = EpisodeStatus.ENDPOINT_ERROR, EpisodeStatus.FAILED
    assert not outage.record(down, "EndpointHTTPError: 500")
    assert not outage.record(ok)  # an answered episode resets the streak
    assert not outage.record(down) and outage.streak == 1
    assert outage.record(down, "EndpointError: refused") and outage.tripped
    assert "2 episodes in a row (EndpointError: refused)" in outage.message("k")
    assert not outage.record(down)  # tripped once; stays tripped
    assert not outage.record(ok) and outage.tripped
    never = EndpointOutage(limit=0)
    assert not any(never.record(down) for _ in range(20)) and not never.tripped
