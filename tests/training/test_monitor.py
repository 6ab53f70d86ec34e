"""The production watch (`training.monitor`, issue 45 item 4) through the monitor suite in
Great Expectations: imported production trajectories (an ATIF export of each episode,
imported back: what `epiflow import` reads) whose tool-failure rate is worse than the
champion's evaluation baseline are a breach: stored with the champion's evaluation (kept
by a later evaluation), and the alias rolled back to the previous champion with the
figures; a window of only infrastructure failures raises none (an environment alert at
most), and a healthy window leaves the alias alone. SQLite and PostgreSQL
(`migrated_engine`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent.atif_convert import from_atif, to_atif
from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from expectations.suite_files import QcAction
from storage.objects import LocalObjectStore
from tests.training.factory import call_step, episode, final_step, garbage_step
from tests.training.test_aliases import _checkpoint
from training.aliases import AliasConflict, alias_history, alias_target, point_alias
from training.evaluation import evaluation_metrics
from training.monitor import MonitorRule, MonitorVerdict, judge_window, watch_alias
from training.registry import get_checkpoint, record_evaluation

RULE = MonitorRule(min_episodes=4)


@pytest.fixture
def store(tmp_path: Path) -> LocalObjectStore:
    s = LocalObjectStore(tmp_path / "objects")
    s.check()
    return s


def _imported(episodes: list[Trajectory]) -> list[Trajectory]:
    """The episodes as production traces: exported to ATIF and imported into a run."""
    return [from_atif(to_atif(t), run_key="production") for t in episodes]


def _failing(i: int) -> Trajectory:
    """Every acting turn of the episode fails (exit code 1)."""
    return episode(
        task=i,
        success=False,
        steps=[call_step(0, "cat nope", output="", exit_code=1), final_step(1)],
    )


def _infrastructure(i: int) -> Trajectory:
    """The sandbox died under the episode: its failed turns are not the model's."""
    return _failing(i).model_copy(
        update={"status": EpisodeStatus.ENV_ERROR, "failure_category": FailureCategory.ENV_ERROR}
    )


def test_a_regressed_window_is_a_breach_and_rolls_the_alias_back(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    previous, champion = _checkpoint(migrated_engine, store), _checkpoint(migrated_engine, store)
    point_alias(migrated_engine, store, "champion", previous, reason="r", actor="t")
    point_alias(migrated_engine, store, "champion", champion, reason="promoted", actor="t")
    record_evaluation(migrated_engine, champion, {"tool_failure_rate": 0.0, "completion_rate": 1.0})

    def watch(window: list[Trajectory]) -> MonitorVerdict:
        return watch_alias(
            migrated_engine, store, "champion", _imported(window), rule=RULE, actor="monitor",
            rollback=True,
        )  # fmt: skip

    healthy = watch([episode(task=i) for i in range(4)])
    only_infrastructure = watch([_infrastructure(i) for i in range(6)])
    assert not healthy.breach and "within the rule" in healthy.reason
    assert not only_infrastructure.breach
    assert "0 episodes of the model's own (6 infrastructure" in only_infrastructure.reason
    assert only_infrastructure.report is not None
    [alert] = only_infrastructure.report.alerts
    assert (alert.expectation, alert.observed) == ("environment.infrastructure_share", 1.0)
    assert "environment alert (not the model's)" in only_infrastructure.reason
    unchanged = alias_target(migrated_engine, "champion")
    assert unchanged is not None and unchanged.checkpoint_id == champion
    assert "monitor_breaches" not in (get_checkpoint(migrated_engine, champion).evaluation or {})

    breach = watch([_failing(i) for i in range(4)] + [_infrastructure(9)])
    assert breach.breach and breach.rolled_back_to == f"hf:checkpoint/{previous}"
    assert "logic.tool_failure_rate 1.000 > 0.100 (baseline 0.000)" in breach.reason
    assert "on 4 episodes (1 infrastructure outcomes left out)" in breach.reason
    assert breach.report is not None
    assert {c.expectation for c in breach.report.breaches} == {
        "logic.tool_failure_rate",
        "result.completion_rate",
    }
    skipped = {c.expectation: c.note for c in breach.report.checks if c.status == "skipped"}
    assert skipped == {
        "efficiency.avg_steps": "the champion's evaluation has no avg_steps",
        "format.parse_error_rate": "the champion's evaluation has no parse_error_rate",
    }
    back = alias_target(migrated_engine, "champion")
    assert back is not None and (back.checkpoint_id, back.action) == (previous, "rollback")
    assert back.reason.startswith("monitor breach:") and back.evidence["window_infrastructure"] == 1
    tool_check = back.evidence["checks"]["logic.tool_failure_rate"]
    assert (tool_check["status"], tool_check["observed"], tool_check["max_value"]) == (
        "failed",
        1.0,
        pytest.approx(0.1),
    )
    assert len(alias_history(migrated_engine, "champion")) == 3
    [stored] = get_checkpoint(migrated_engine, champion).evaluation["monitor_breaches"]
    assert stored["figures"]["checks"]["logic.tool_failure_rate"]["observed"] == 1.0
    assert stored["actor"] == "monitor" and stored["alias"] == "champion"

    # A later evaluation of the checkpoint keeps the breach recorded against it.
    record_evaluation(migrated_engine, champion, {"tool_failure_rate": 0.2})
    kept = get_checkpoint(migrated_engine, champion).evaluation
    assert kept["tool_failure_rate"] == 0.2 and len(kept["monitor_breaches"]) == 1


def test_a_rollback_never_moves_a_champion_it_did_not_judge(
    migrated_engine: Engine, store: LocalObjectStore
) -> None:
    """A promotion between the baseline read and the rollback: the breach is stored with
    the champion judged, nothing is rolled back (the new champion was never judged)."""
    from training.monitor import champion_baseline, record_breach

    first, second, third = (_checkpoint(migrated_engine, store) for _ in range(3))
    for checkpoint in (first, second):
        point_alias(migrated_engine, store, "champion", checkpoint, reason="r", actor="t")
    record_evaluation(migrated_engine, second, {"tool_failure_rate": 0.0})
    judged = champion_baseline(migrated_engine, "champion")
    verdict = judge_window(_imported([_failing(i) for i in range(4)]), judged.baseline, RULE)
    point_alias(migrated_engine, store, "champion", third, reason="newer", actor="t")
    with pytest.raises(AliasConflict, match="changed since change 2 was judged"):
        record_breach(migrated_engine, store, judged, verdict, actor="monitor", rollback=True)
    now = alias_target(migrated_engine, "champion")
    assert now is not None and now.checkpoint_id == third
    assert len(get_checkpoint(migrated_engine, second).evaluation["monitor_breaches"]) == 1


def test_the_suite_sees_the_evaluation_figures_of_the_window() -> None:
    """GX's means over the window's frames are `evaluation_metrics`'s figures of the same
    episodes: one rule per figure, whether a checkpoint is evaluated or watched."""
    window = [
        episode(task=0),
        episode(task=1, steps=[garbage_step(0), call_step(1, "ls"), final_step(2)]),
        _failing(2),
        episode(task=3, success=False, steps=[call_step(0, "x", exit_code=2), garbage_step(1)]),
        _infrastructure(4),
    ]
    metrics = evaluation_metrics(window)
    baseline = {
        "completion_rate": metrics.completion_rate,
        "avg_steps": metrics.avg_steps,
        "tool_failure_rate": metrics.tool_failure_rate,
        "parse_error_rate": metrics.parse_error_rate or 0.0,
    }
    verdict = judge_window(window, baseline, RULE)
    assert verdict.report is not None and not verdict.breach
    observed = {c.expectation: c.observed for c in verdict.report.checks}
    assert observed == {
        "result.completion_rate": pytest.approx(metrics.completion_rate),
        "efficiency.avg_steps": pytest.approx(metrics.avg_steps),
        "logic.tool_failure_rate": pytest.approx(metrics.tool_failure_rate),
        "format.parse_error_rate": pytest.approx(metrics.parse_error_rate),
        "environment.infrastructure_share": pytest.approx(1 / 5),
    }
    assert all(c.status == "ok" for c in verdict.report.checks)
    # The polars reference evaluation of the same suite agrees with GX.
    reference = judge_window(window, baseline, RULE, engine="polars")
    assert reference.report is not None
    assert [(c.expectation, c.status) for c in reference.report.checks] == [
        (c.expectation, c.status) for c in verdict.report.checks
    ]
    assert {c.action for c in verdict.report.checks} == {QcAction.BREACH, QcAction.ALERT}
