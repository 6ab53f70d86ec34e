"""The quality gate, without any database: trajectories (or feature frames) in, verdicts out.

    run_gate(trajectories, config=load_qc_config())             # the usual entry (config.settings)
    evaluate_features(features, config=..., engine="gx")         # features already built

Verdict per episode (seed 000 §3.3, §6 pitfall 4):

- discard if any failed expectation with action `discard` names it (broken format:
  a parse error never recovered from, a majority of unparseable messages, or the episode
  ended on parse failures; environment errors; aborted/incomplete episodes);
- else downweight if any `downweight` expectation names it (recovered parse errors, logic,
  safety, efficiency);
- else keep.

`reward_sign` is −1 when the result expectation names it (negative final reward), else +1;
it never changes the verdict: failures are kept as negative samples. Quality is
`rubric_mean / 5 × multiplier[verdict]` (`scoring.quality`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Literal

import polars as pl

from agent.trajectory import Trajectory
from expectations.features import compute_features
from expectations.frames import QcFrames, build_frames, judge_frame, judgement_rows
from expectations.outcomes import ExpectationOutcome
from expectations.polars_checks import evaluate_suite_polars
from expectations.report import BatchCheck, GateReport, Reason
from expectations.settings import QcConfig
from expectations.suite_files import QcAction, SuiteSpec, load_suite
from expectations.token_drift import TokenizerResolver, checkpoint_tokenizer, token_drift
from scoring.claims import FABRICATION_CODES
from scoring.quality import Verdict
from scoring.rubric import Dimension, Judgement
from scoring.rule_judge import rule_judgement

__all__ = [
    "GateEngine",
    "evaluate_features",
    "gate_features",
    "judge_rows",
    "judgement_findings",
    "load_suites",
    "run_gate",
]

GateEngine = Literal["gx", "polars"]
"""`gx`: Great Expectations (production); `polars`: the reference evaluation of the same suites."""


def load_suites(config: QcConfig) -> tuple[SuiteSpec, SuiteSpec]:
    """The episode and batch suites of the configured versions.

    Raises:
        SuiteError: a suite file is missing or invalid.
    """
    g = config.gate
    return (
        load_suite(g.suites_dir, "episode", g.episode_suite_version),
        load_suite(g.suites_dir, "batch", g.batch_suite_version),
    )


def judgement_findings(judgements: Sequence[Judgement]) -> list[dict[str, Any]]:
    """Rule-judge findings per episode, in `JUDGE_SCHEMA` form (counted from its deductions)."""
    rows: list[dict[str, Any]] = []
    for j in judgements:
        if j.rubric is None:
            continue
        codes = [d.code for d in j.rubric.deductions]
        rows.append(
            {
                "episode_id": j.episode_id,
                "rubric_mean": j.rubric.mean,
                "n_blind_writes": codes.count("blind_write"),
                "n_fabrications": sum(c in FABRICATION_CODES for c in codes),
                "n_safety_violations": sum(
                    d.dimension is Dimension.SAFETY for d in j.rubric.deductions
                ),
                "false_final_claim": "false_final_claim" in codes,
            }
        )
    return rows


def judge_rows(trajectories: Sequence[Trajectory], config: QcConfig) -> list[dict[str, Any]]:
    """`judgement_findings` of the rule judge's judgement of each trajectory."""
    return judgement_findings([rule_judgement(t, config.judge) for t in trajectories])


def _failure_modes(
    features: pl.DataFrame, steps: pl.DataFrame | None
) -> tuple[dict[str, int], dict[str, int]]:
    by_category = dict(
        features.filter(pl.col("status") != "success")
        .group_by("failure_category")
        .len()
        .iter_rows()
    )
    by_tool: dict[str, int] = {}
    if steps is not None:
        by_tool = dict(
            steps.filter(pl.col("failed") & pl.col("tool").is_not_null())
            .group_by("tool")
            .len()
            .iter_rows()
        )
    return {str(k): int(v) for k, v in by_category.items()}, {
        str(k): int(v) for k, v in by_tool.items()
    }


def _verdicts(
    features: pl.DataFrame, outcomes: list[ExpectationOutcome], suite: SuiteSpec, config: QcConfig
) -> pl.DataFrame:
    specs = suite.by_id()
    ids: list[str] = []
    reasons: list[str] = []
    for o in outcomes:
        if not o.success:
            ids.extend(o.unexpected_episode_ids)
            reasons.extend([o.expectation] * len(o.unexpected_episode_ids))
    actions = pl.DataFrame(
        {"expectation": list(specs), "action": [s.meta.action.value for s in specs.values()]},
        schema={"expectation": pl.String, "action": pl.String},
    )
    failed = (
        pl.DataFrame(
            {"episode_id": ids, "expectation": reasons},
            schema={"episode_id": pl.String, "expectation": pl.String},
        )
        .join(actions, on="expectation", how="left")
        .group_by("episode_id")
        .agg(
            pl.col("expectation").alias("reasons"),
            (pl.col("action") == QcAction.DISCARD.value).any().alias("any_discard"),
            (pl.col("action") == QcAction.DOWNWEIGHT.value).any().alias("any_downweight"),
            (pl.col("action") == QcAction.REWARD_SIGN.value).any().alias("negative"),
        )
    )
    q = config.quality
    verdict = (
        pl.when(pl.col("any_discard"))
        .then(pl.lit(Verdict.DISCARD.value))
        .when(pl.col("any_downweight"))
        .then(pl.lit(Verdict.DOWNWEIGHT.value))
        .otherwise(pl.lit(Verdict.KEEP.value))
    )
    multiplier = (
        pl.when(pl.col("verdict") == Verdict.DISCARD.value)
        .then(q.discard_multiplier)
        .when(pl.col("verdict") == Verdict.DOWNWEIGHT.value)
        .then(q.downweight_multiplier)
        .otherwise(q.keep_multiplier)
    )
    return (
        features.select("episode_id", "rubric_mean")
        .join(failed, on="episode_id", how="left")
        .with_columns(
            pl.col("reasons").fill_null(pl.lit([], dtype=pl.List(pl.String))),
            pl.col("any_discard").fill_null(False),
            pl.col("any_downweight").fill_null(False),
            pl.col("negative").fill_null(False),
            pl.col("rubric_mean").fill_null(0.0),
        )
        .with_columns(verdict.alias("verdict"))
        .with_columns(
            (pl.col("rubric_mean") / 5.0 * multiplier).clip(0.0, 1.0).alias("quality_score"),
            pl.when(pl.col("negative")).then(-1).otherwise(1).cast(pl.Int8).alias("reward_sign"),
        )
        .select("episode_id", "verdict", "quality_score", "reward_sign", "rubric_mean", "reasons")
    )


def evaluate_features(
    features: pl.DataFrame,
    *,
    config: QcConfig,
    engine: GateEngine = "gx",
    steps: pl.DataFrame | None = None,
    docs_dir: Path | None = None,
) -> GateReport:
    """Run both suites on a feature frame (`expectations.features.FEATURE_COLUMNS`).

    `steps` (the step frame) only feeds the failure-modes-by-tool summary. `docs_dir`
    builds GX data docs there (engine `gx` only).

    Raises:
        SuiteError: a suite file is missing or invalid.
        SuiteExecutionError: GX raised while evaluating an expectation.
    """
    episode_suite, batch_suite = load_suites(config)
    docs_index: Path | None = None
    if engine == "gx":
        from expectations.gx_runner import GxRunner

        runner = GxRunner(episode_suite, batch_suite)
        frame = features.to_pandas()
        episode_outcomes = runner.validate_episodes(frame)
        batch_outcomes = runner.validate_batch(frame)
        if docs_dir is not None:
            docs_index = runner.build_data_docs(docs_dir)
    else:
        episode_outcomes = evaluate_suite_polars(features, episode_suite)
        batch_outcomes = evaluate_suite_polars(features, batch_suite)
    catalog = {
        e.meta.id: Reason(
            expectation=e.meta.id,
            category=e.meta.category,
            action=e.meta.action,
            message=e.meta.reason,
        )
        for e in (*episode_suite.expectations, *batch_suite.expectations)
    }
    batch_specs = batch_suite.by_id()
    batch_checks = [
        BatchCheck(
            expectation=o.expectation,
            category=batch_specs[o.expectation].meta.category,
            success=o.success,
            observed_value=o.observed_value,
            message=batch_specs[o.expectation].meta.reason,
        )
        for o in batch_outcomes
    ]
    by_category, by_tool = _failure_modes(features, steps)
    return GateReport(
        suite_versions={
            episode_suite.name: episode_suite.version,
            batch_suite.name: batch_suite.version,
        },
        batch_passed=all(c.success for c in batch_checks),
        batch_checks=batch_checks,
        verdicts=_verdicts(features, episode_outcomes, episode_suite, config),
        reason_catalog=catalog,
        failure_modes_by_category=by_category,
        failure_modes_by_tool=by_tool,
        data_docs_index=docs_index,
    )


def gate_features(
    trajectories: Sequence[Trajectory],
    *,
    config: QcConfig,
    rule_judgements: Sequence[Judgement] | None = None,
    judgements: Mapping[str, Judgement] | None = None,
) -> tuple[pl.DataFrame, pl.DataFrame]:
    """The episode feature frame the suites run on, and the step frame (the first half of
    `run_gate`; `evaluate_features` is the second). Arguments as `run_gate`."""
    frames: QcFrames = build_frames(trajectories)
    rules = (
        rule_judgements
        if rule_judgements is not None
        else [rule_judgement(t, config.judge) for t in trajectories]
    )
    judged = judge_frame(judgement_findings(rules))
    if judgements:
        overrides = pl.DataFrame(
            judgement_rows(judgements.values()),
            schema={"episode_id": pl.String, "rubric_mean": pl.Float64},
        )
        judged = (
            judged.join(overrides, on="episode_id", how="left", suffix="_override")
            .with_columns(pl.coalesce("rubric_mean_override", "rubric_mean").alias("rubric_mean"))
            .drop("rubric_mean_override")
        )
    features = compute_features(frames, judged, gate=config.gate, rewards=config.rewards)
    return features, frames.steps


def run_gate(
    trajectories: Sequence[Trajectory],
    *,
    config: QcConfig,
    rule_judgements: Sequence[Judgement] | None = None,
    judgements: Mapping[str, Judgement] | None = None,
    engine: GateEngine = "gx",
    docs_dir: Path | None = None,
    tokenizer_for: TokenizerResolver = checkpoint_tokenizer,
) -> GateReport:
    """Gate a batch of trajectories: rule judge, polars features, both suites, verdicts,
    and the re-encoding drift of the sampled ids the steps recorded (`tokenizer_for`: the
    tokenizer of a policy spec; by default an `hf:<dir>` policy's).

    `rule_judgements` are the rule judge's judgements of these trajectories when the caller
    already has them (each episode is judged once per gate); otherwise they are made here.
    `judgements` (episode id → judgement, e.g. from the LLM judge) replace the rule judge's
    rubric mean in the quality score where they parsed; the rule judge's findings still
    feed the expectations.

    Raises:
        SuiteError: a suite file is missing or invalid.
        SuiteExecutionError: GX raised while evaluating an expectation.
    """
    features, steps = gate_features(
        trajectories, config=config, rule_judgements=rule_judgements, judgements=judgements
    )
    report = evaluate_features(
        features, config=config, engine=engine, steps=steps, docs_dir=docs_dir
    )
    drift = token_drift(trajectories, tokenizer_for=tokenizer_for)
    return report.model_copy(update={"token_drift": drift}) if drift else report
