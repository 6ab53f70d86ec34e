"""Polars features: hand-checked values and agreement with the per-trajectory Python rules."""

from __future__ import annotations

import polars as pl
import pytest

from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from expectations.errors import FeatureSchemaError
from expectations.features import FEATURE_COLUMNS, compute_features
from expectations.frames import build_frames, judge_frame
from expectations.gate import judge_rows
from expectations.settings import QcConfig
from scoring.calls import blind_write_steps, is_format_error, repeated_call_steps
from scoring.rewards import final_reward
from tests.scoring.qc_builders import (
    PERTURBATIONS,
    call,
    final,
    list_step,
    oracle,
    parse_error,
    read_step,
    trajectory,
    write_step,
)


def features_of(trajectories: list[Trajectory], config: QcConfig) -> pl.DataFrame:
    frames = build_frames(trajectories)
    return compute_features(
        frames,
        judge_frame(judge_rows(trajectories, config)),
        gate=config.gate,
        rewards=config.rewards,
    )


def varied() -> list[Trajectory]:
    out = [oracle(rollout=0)]
    out += [build(rollout=i + 1) for i, build in enumerate(PERTURBATIONS.values())]
    faulty = call(
        1,
        "read_file",
        {"path": "data/sales.csv"},
        exit_code=None,
        error_type="permission_denied",
        fault="permission_denied",
    )
    out.append(
        trajectory(
            [
                list_step(0),
                faulty,
                read_step(2),
                write_step(3),
                list_step(4),
                list_step(5),
                final(6),
            ],
            rollout=20,
        )
    )
    out.append(
        trajectory([parse_error(0, "x"), parse_error(1, "y"), list_step(2)], score=0.0, rollout=21)
    )
    out.append(
        trajectory(
            [list_step(0), write_step(1), write_step(2)], rollout=22, prompt="Write out/total.txt."
        )
    )
    return out


def test_features_agree_with_the_python_rules(config: QcConfig) -> None:
    trajectories = varied()
    f = features_of(trajectories, config).sort("episode_id")
    by_id = {str(t.episode_id): t for t in trajectories}
    for row in f.iter_rows(named=True):
        t = by_id[row["episode_id"]]
        assert row["n_steps"] == t.n_steps
        assert row["n_parse_errors"] == sum(is_format_error(s) for s in t.steps)
        assert row["n_repeated_calls"] == len(repeated_call_steps(t.steps)), t.rollout_index
        assert row["n_blind_writes"] == len(blind_write_steps(t))
        assert row["final_reward"] == pytest.approx(final_reward(t.verifier_score, config.rewards))
    assert f.columns == list(FEATURE_COLUMNS)


def test_hand_checked_values(config: QcConfig) -> None:
    unrecovered = trajectory(
        [list_step(0), read_step(1), parse_error(2, "bad")],
        score=0.0,
        rollout=1,
        category=FailureCategory.MAX_STEPS,
    )
    majority = trajectory(
        [parse_error(0, "a"), parse_error(1, "b"), list_step(2), final(3)], score=0.0, rollout=2
    )
    env = oracle(
        rollout=3, score=None, status=EpisodeStatus.ENV_ERROR, category=FailureCategory.ENV_ERROR
    )
    crashed_step = call(
        1, "read_file", {"path": "data/sales.csv"}, exit_code=None, error_type="sandbox_crashed"
    )
    env_step = trajectory([list_step(0), crashed_step], score=None, rollout=4)
    aborted = oracle(rollout=5, status=EpisodeStatus.ABORTED, category=FailureCategory.ABORTED)
    dup = trajectory(
        [list_step(0), call(1, "read_file", {"path": "data/sales.csv"}, call_id="c0"), final(2)],
        rollout=6,
    )
    neg = trajectory([call(0, "list_dir", {"path": "."}, duration_ms=-3.0), final(1)], rollout=7)
    f = {
        r["episode_id"]: r
        for r in features_of(
            [unrecovered, majority, env, env_step, aborted, dup, neg], config
        ).iter_rows(named=True)
    }
    row = lambda t: f[str(t.episode_id)]  # noqa: E731
    assert (
        row(unrecovered)["n_unrecovered_parse_errors"],
        row(unrecovered)["parse_error_rate"],
    ) == (1, pytest.approx(1 / 3))
    assert (row(majority)["n_unrecovered_parse_errors"], row(majority)["parse_error_rate"]) == (
        0,
        0.5,
    )
    assert (row(env)["env_error"], row(env_step)["env_error"], row(aborted)["env_error"]) == (
        1,
        1,
        0,
    )
    assert row(aborted)["incomplete"] == 1
    assert row(dup)["n_duplicate_call_ids"] == 1
    assert row(neg)["min_step_duration_ms"] == -3.0
    assert row(unrecovered)["final_reward"] == -0.5 and row(unrecovered)["success"] == 0


def test_robust_z_flags_step_outliers_within_a_template(config: QcConfig) -> None:
    normal = [oracle(rollout=i) for i in range(9)]
    long_steps = [list_step(0), read_step(1)] + [
        call(i, "execute_shell", {"command": f"echo {i}"}) for i in range(2, 30)
    ]
    long = trajectory([*long_steps, write_step(30), final(31)], rollout=99)
    f = features_of([*normal, long], config)
    z = dict(zip(f["episode_id"], f["steps_robust_z"], strict=True))
    assert z[str(long.episode_id)] == pytest.approx((32 - 4) / config.gate.steps_mad_floor)
    assert all(z[str(t.episode_id)] == 0.0 for t in normal)
    # Too few episodes of a template: no outlier verdict at all.
    small = features_of([oracle(rollout=0), long], config)
    assert small["steps_robust_z"].null_count() == 2


def test_missing_columns_are_a_typed_error(config: QcConfig) -> None:
    frames = build_frames([oracle()])
    with pytest.raises(FeatureSchemaError, match="judge frame lacks"):
        compute_features(
            frames, pl.DataFrame({"episode_id": ["x"]}), gate=config.gate, rewards=config.rewards
        )


def test_an_endpoint_error_is_an_environment_failure(config: QcConfig) -> None:
    """A model endpoint that failed is infrastructure: the gate discards it as
    environment, like a crashed sandbox, never as the agent's (issue 22)."""
    down = oracle(
        rollout=0,
        score=None,
        status=EpisodeStatus.ENDPOINT_ERROR,
        category=FailureCategory.ENDPOINT_ERROR,
    )
    fine = oracle(rollout=1)
    f = {r["episode_id"]: r for r in features_of([down, fine], config).iter_rows(named=True)}
    assert f[str(down.episode_id)]["env_error"] == 1
    assert f[str(fine.episode_id)]["env_error"] == 0
