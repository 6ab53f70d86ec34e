"""The production watch (`training.monitor`, issue 45 item 4): imported production
trajectories (an ATIF export of each episode, imported back: what `epiflow import`
reads) whose tool-failure rate is worse than the champion's evaluation baseline are a
breach: stored with the champion's evaluation, and the alias rolled back to the previous
champion with the figures; a window of only infrastructure failures raises none, and a
healthy window leaves the alias alone. SQLite and PostgreSQL (`migrated_engine`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine

from agent.atif_convert import from_atif, to_atif
from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from storage.objects import LocalObjectStore
from tests.training.factory import call_step, episode, final_step
from tests.training.test_aliases import _checkpoint
from training.aliases import alias_history, alias_target, point_alias
from training.monitor import MonitorRule, MonitorVerdict, watch_alias
from training.registry import get_checkpoint, record_evaluation

RULE = MonitorRule(tool_failure_tolerance=0.1, min_episodes=4)


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
    unchanged = alias_target(migrated_engine, "champion")
    assert unchanged is not None and unchanged.checkpoint_id == champion

    breach = watch([_failing(i) for i in range(4)] + [_infrastructure(9)])
    assert breach.breach and breach.rolled_back_to == f"hf:checkpoint/{previous}"
    assert "tool failures 1.000 vs the baseline 0.000 on 4 episodes" in breach.reason
    back = alias_target(migrated_engine, "champion")
    assert back is not None and (back.checkpoint_id, back.action) == (previous, "rollback")
    assert back.reason.startswith("monitor breach:") and back.evidence["window_infrastructure"] == 1
    assert len(alias_history(migrated_engine, "champion")) == 3
    [stored] = get_checkpoint(migrated_engine, champion).evaluation["monitor_breaches"]
    assert stored["figures"]["window_tool_failure_rate"] == 1.0 and stored["actor"] == "monitor"
