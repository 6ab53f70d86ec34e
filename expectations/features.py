"""Episode features for the suites, computed with polars from the episode/step/judge frames.

One row per episode (`FEATURE_COLUMNS`). Each column is what one expectation looks at:

- format: `n_parse_errors`, `parse_error_rate`, `n_unrecovered_parse_errors` (parse errors
  with no parsed message after them), `failure_category`;
- logic: `n_blind_writes` (writes before reading their inputs) and `n_fabrications`, both
  from the rule judge (they need the prompt and the agent's text, step by step);
- safety: `n_safety_violations` (rule judge);
- result: `final_reward` (`scoring.rewards.final_reward`, the one formula), `success`;
- efficiency: `n_repeated_calls` (identical to the previous identical call, no workspace
  change in between, that call not a transient failure), `steps_robust_z`/`duration_robust_z` (per template:
  (x − median) / max(1.4826·MAD, floor); null for templates with too few episodes);
- environment: `env_error`, `incomplete`;
- integrity (batch): `n_duplicate_call_ids`, `min_step_duration_ms`, `duration_ms`.
"""

from __future__ import annotations

import polars as pl

from expectations.frames import EPISODE_SCHEMA, JUDGE_SCHEMA, STEP_SCHEMA, QcFrames, require_columns
from expectations.settings import GateSettings
from scoring.rewards import final_reward
from scoring.settings import RewardSettings

__all__ = ["FEATURE_COLUMNS", "compute_features"]

FEATURE_COLUMNS = (
    "episode_id",
    "template",
    "status",
    "failure_category",
    "verifier_score",
    "n_steps",
    "n_tool_calls",
    "n_failed_calls",
    "n_parse_errors",
    "parse_error_rate",
    "n_unrecovered_parse_errors",
    "n_blind_writes",
    "n_fabrications",
    "n_safety_violations",
    "false_final_claim",
    "final_reward",
    "success",
    "n_repeated_calls",
    "steps_robust_z",
    "duration_robust_z",
    "env_error",
    "incomplete",
    "n_duplicate_call_ids",
    "min_step_duration_ms",
    "duration_ms",
    "rubric_mean",
)
"""Columns of the feature frame, in order."""

_EP = "episode_id"


def _step_features(steps: pl.DataFrame, gate: GateSettings) -> pl.DataFrame:
    changed = (pl.col("n_files_changed") > 0).cast(pl.Int64)
    same_call = [_EP, "signature"]
    fmt_error = pl.col("parse_kind").is_in(["error", "none"]) | pl.col("has_parse_error")
    called = pl.col("signature").is_not_null()
    s = (
        steps.sort([_EP, "index"])
        .with_columns(
            fmt_error.alias("fmt_error"),
            # Workspace changes up to and including this step, and strictly before it.
            changed.cum_sum().over(_EP).alias("changes_after"),
            (changed.cum_sum().over(_EP) - changed).alias("changes_before"),
        )
        .with_columns(
            (
                called
                # The previous identical call left the workspace as this call finds it …
                & (pl.col("changes_before") == pl.col("changes_after").shift(1).over(same_call))
                # … and did not fail transiently (a retry is recovery, not repetition).
                & (pl.col("transient").shift(1).over(same_call) == False)  # noqa: E712
            )
            .fill_null(False)
            .alias("repeated"),
        )
    )
    return s.group_by(_EP).agg(
        pl.len().alias("n_steps"),
        called.sum().alias("n_tool_calls"),
        (called & pl.col("failed")).sum().alias("n_failed_calls"),
        pl.col("fmt_error").sum().alias("n_parse_errors"),
        (
            pl.col("fmt_error")
            & (pl.col("index") > pl.col("index").filter(~pl.col("fmt_error")).max()).fill_null(True)
        )
        .sum()
        .alias("n_unrecovered_parse_errors"),
        pl.col("repeated").sum().alias("n_repeated_calls"),
        pl.col("error_type").is_in(list(gate.env_error_types)).any().alias("step_env_error"),
        (
            pl.col("call_id").filter(called).drop_nulls().len()
            - pl.col("call_id").filter(called).drop_nulls().n_unique()
        ).alias("n_duplicate_call_ids"),
        pl.col("duration_ms").min().alias("min_step_duration_ms"),
        pl.col("duration_ms").sum().alias("sum_step_duration_ms"),
    )


def _robust_z(column: str, floor: float, min_group: int) -> pl.Expr:
    x = pl.col(column).cast(pl.Float64)
    med = x.median().over("template")
    mad = (x - med).abs().median().over("template")
    z = (x - med) / pl.max_horizontal(1.4826 * mad, pl.lit(floor))
    return pl.when(x.count().over("template") >= min_group).then(z).otherwise(None)


def _final_reward(rewards: RewardSettings) -> pl.Expr:
    """`scoring.rewards.final_reward` per episode: the one formula, not a polars copy of it."""
    return pl.col("verifier_score").map_elements(
        lambda score: final_reward(score, rewards), return_dtype=pl.Float64, skip_nulls=False
    )


def _success(rewards: RewardSettings) -> pl.Expr:
    """The one success rule per episode (`SuccessSettings.is_success`, the rule of the status)."""
    return pl.col("verifier_score").map_elements(
        lambda score: int(rewards.success.is_success(score)),
        return_dtype=pl.Int8,
        skip_nulls=False,
    )


def compute_features(
    frames: QcFrames, judge: pl.DataFrame, *, gate: GateSettings, rewards: RewardSettings
) -> pl.DataFrame:
    """The episode feature frame (`FEATURE_COLUMNS`), one row per episode of `frames.episodes`.

    Raises:
        FeatureSchemaError: a frame lacks a column its schema requires.
    """
    require_columns(frames.episodes, EPISODE_SCHEMA, "episode")
    require_columns(frames.steps, STEP_SCHEMA, "step")
    require_columns(judge, JUDGE_SCHEMA, "judge")
    per_episode = _step_features(frames.steps, gate)
    counts = [
        "n_steps",
        "n_tool_calls",
        "n_failed_calls",
        "n_parse_errors",
        "n_unrecovered_parse_errors",
        "n_repeated_calls",
        "n_duplicate_call_ids",
        "n_blind_writes",
        "n_fabrications",
        "n_safety_violations",
    ]
    df = (
        frames.episodes.join(per_episode, on=_EP, how="left")
        .join(judge.select(JUDGE_SCHEMA.keys()), on=_EP, how="left")
        .with_columns(
            [pl.col(c).fill_null(0).cast(pl.Int64) for c in counts]
            + [
                pl.col("false_final_claim").fill_null(False),
                pl.col("step_env_error").fill_null(False),
                pl.col("min_step_duration_ms").fill_null(0.0),
                pl.col("duration_ms").fill_null(pl.col("sum_step_duration_ms")).fill_null(0.0),
            ]
        )
        .with_columns(
            pl.when(pl.col("n_steps") > 0)
            .then(pl.col("n_parse_errors") / pl.col("n_steps"))
            .otherwise(0.0)
            .alias("parse_error_rate"),
            _final_reward(rewards).alias("final_reward"),
            _success(rewards).alias("success"),
            (
                pl.col("status").is_in(list(gate.env_error_statuses))
                | (pl.col("failure_category") == "env_error")
                | pl.col("step_env_error")
            )
            .cast(pl.Int8)
            .alias("env_error"),
            pl.col("status")
            .is_in(list(gate.incomplete_statuses))
            .cast(pl.Int8)
            .alias("incomplete"),
            pl.col("false_final_claim").cast(pl.Int8),
        )
        .with_columns(
            _robust_z("n_steps", gate.steps_mad_floor, gate.outlier_min_group).alias(
                "steps_robust_z"
            ),
            _robust_z("duration_ms", gate.duration_mad_floor_ms, gate.outlier_min_group).alias(
                "duration_robust_z"
            ),
        )
    )
    return df.select(FEATURE_COLUMNS)
