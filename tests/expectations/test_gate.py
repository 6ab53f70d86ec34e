"""The gate end to end (no database): noisy collections, broken sandboxes, the format line,
GX vs the polars reference, quality scores, data docs and the trigger."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import polars as pl
import pytest

from agent.trajectory import EpisodeStatus, FailureCategory, Trajectory
from expectations.errors import SuiteExecutionError
from expectations.features import compute_features
from expectations.frames import build_frames, judge_frame
from expectations.gate import evaluate_features, judge_rows, run_gate
from expectations.report import GateReport, render_markdown
from expectations.settings import QcConfig
from scoring.quality import Verdict, should_trigger_training
from scoring.rubric import Judgement, RubricScore
from tests.scoring.qc_builders import (
    PERTURBATIONS,
    call,
    final,
    list_step,
    oracle,
    parse_error,
    read_step,
    trajectory,
)

# Seed 000 §3.3 with the §6-pitfall-4 line (recovered format blemish → downweight):
# perturbation kind (as recorded on the step by `scripted:noisy`) → (verdict, reward sign, reasons).
RECOVERED = "format.recovered_parse_error"
EXPECTED: dict[str, tuple[Verdict, int, set[str]]] = {
    "malformed": (Verdict.DOWNWEIGHT, 1, {RECOVERED}),
    "unknown_tool": (Verdict.DOWNWEIGHT, 1, {RECOVERED}),
    "missing_arg": (Verdict.DOWNWEIGHT, 1, {RECOVERED}),
    "mistyped_arg": (Verdict.DOWNWEIGHT, 1, {RECOVERED}),
    "premature_final": (Verdict.KEEP, -1, {"result.negative_reward"}),
    "fabricated_claim": (Verdict.DOWNWEIGHT, 1, {RECOVERED, "logic.fabricated_claim"}),
    "repeated_command": (Verdict.DOWNWEIGHT, 1, {"efficiency.repeated_call"}),
    "skipped_step": (Verdict.DOWNWEIGHT, 1, {"logic.write_before_read"}),
}


def perturbation_of(t: Trajectory) -> str | None:
    """The perturbation the noisy policy recorded on the episode's steps (tests only)."""
    kinds = {s.policy_perturbation for s in t.steps if s.policy_perturbation is not None}
    assert len(kinds) <= 1
    return kinds.pop() if kinds else None


def noisy_collection() -> tuple[list[Trajectory], dict[str, str]]:
    """8 clean episodes and one of each perturbation, as a `scripted:noisy` run yields them."""
    episodes = [oracle(rollout=i) for i in range(8)]
    episodes += [build(rollout=100 + i) for i, build in enumerate(PERTURBATIONS.values())]
    kinds = {str(t.episode_id): k for t in episodes if (k := perturbation_of(t)) is not None}
    assert set(kinds.values()) == set(EXPECTED)
    return episodes, kinds


def verdict_rows(report: GateReport) -> dict[str, dict[str, Any]]:
    return {r["episode_id"]: r for r in report.verdicts.iter_rows(named=True)}


@pytest.fixture(scope="module")
def noisy_report() -> tuple[GateReport, dict[str, str], list[Trajectory]]:
    from expectations.settings import GateSettings
    from scoring.settings import QualitySettings, RewardSettings, RuleJudgeSettings

    config = QcConfig(
        gate=GateSettings(),
        rewards=RewardSettings(),
        judge=RuleJudgeSettings(),
        quality=QualitySettings(),
    )
    episodes, kinds = noisy_collection()
    return run_gate(episodes, config=config, engine="gx"), kinds, episodes


def test_each_perturbation_lands_in_the_seed_verdict(
    noisy_report: tuple[GateReport, dict[str, str], list[Trajectory]],
) -> None:
    report, kinds, episodes = noisy_report
    rows = verdict_rows(report)
    assert report.batch_passed, report.batch_failures
    for t in episodes:
        row = rows[str(t.episode_id)]
        got = (Verdict(row["verdict"]), row["reward_sign"], set(row["reasons"]))
        kind = kinds.get(str(t.episode_id))
        assert got == (EXPECTED[kind] if kind else (Verdict.KEEP, 1, set())), kind
    assert report.counts == {"keep": 9, "downweight": 7, "discard": 0}
    assert report.suite_versions == {"episode": "1", "batch": "1"}


def test_quality_scores_follow_rubric_and_verdict(
    noisy_report: tuple[GateReport, dict[str, str], list[Trajectory]], config: QcConfig
) -> None:
    report, kinds, episodes = noisy_report
    rows = verdict_rows(report)
    rubric = {r["episode_id"]: r["rubric_mean"] for r in judge_rows(episodes, config)}
    for eid, row in rows.items():
        multiplier = 0.5 if row["verdict"] == "downweight" else 1.0
        assert row["quality_score"] == pytest.approx(rubric[eid] / 5 * multiplier)
        assert 0.0 <= row["quality_score"] <= 1.0
    by_kind = {kinds.get(eid, "oracle"): row["quality_score"] for eid, row in rows.items()}
    assert by_kind["oracle"] == 1.0
    # Fabrication is penalised more than a recovered format blemish, both downweighted.
    assert by_kind["fabricated_claim"] < by_kind["malformed"] < 1.0
    assert report.quality_weighted_volume == pytest.approx(
        sum(r["quality_score"] for r in rows.values())
    )


def test_episode_verdicts_expand_reasons(
    noisy_report: tuple[GateReport, dict[str, str], list[Trajectory]],
) -> None:
    report, kinds, _ = noisy_report
    verdicts = {v.episode_id: v for v in report.episode_verdicts()}
    fabricated = next(eid for eid, k in kinds.items() if k == "fabricated_claim")
    reasons = {r.expectation: r for r in verdicts[fabricated].reasons}
    logic = reasons["logic.fabricated_claim"]
    assert (logic.category.value, logic.action.value) == ("logic", "downweight")
    assert "contradict" in logic.message


def test_markdown_artifact(
    noisy_report: tuple[GateReport, dict[str, str], list[Trajectory]],
) -> None:
    report, _, _ = noisy_report
    md = render_markdown(report)
    assert "batch PASSED" in md and "| downweight | 7 |" in md
    assert "| format.recovered_parse_error | 5 | downweight |" in md
    assert "| verifier_failed | 1 |" in md  # premature final, by failure category


def test_broken_sandbox_fails_the_batch(config: QcConfig) -> None:
    good = [oracle(rollout=i) for i in range(16)]
    broken = [
        oracle(
            rollout=100 + i,
            score=None,
            status=EpisodeStatus.ENV_ERROR,
            category=FailureCategory.ENV_ERROR,
        )
        for i in range(2)
    ]
    crashed = trajectory(
        [
            list_step(0),
            call(
                1,
                "read_file",
                {"path": "data/sales.csv"},
                exit_code=None,
                error_type="sandbox_crashed",
            ),
        ],
        score=None,
        rollout=200,
    )
    report = run_gate([*good, *broken, crashed], config=config)
    assert not report.batch_passed
    [failure] = report.batch_failures
    assert failure.expectation == "environment.error_rate"
    assert failure.observed_value == pytest.approx(3 / 19)
    rows = verdict_rows(report)
    for t in [*broken, crashed]:
        assert rows[str(t.episode_id)]["verdict"] == "discard"
        assert "environment.sandbox_error" in rows[str(t.episode_id)]["reasons"]
        assert rows[str(t.episode_id)]["quality_score"] == 0.0
    # One env error in 21 episodes (4.8%) is tolerated.
    assert run_gate(
        [
            *good,
            oracle(rollout=300),
            oracle(rollout=301),
            oracle(rollout=302),
            oracle(rollout=303),
            broken[0],
        ],
        config=config,
    ).batch_passed


@pytest.mark.parametrize(
    ("bad", "check"),
    [
        (
            trajectory(
                [
                    list_step(0),
                    call(1, "read_file", {"path": "data/sales.csv"}, call_id="c0"),
                    final(2),
                ],
                rollout=50,
            ),
            "integrity.duplicate_call_ids",
        ),
        (
            trajectory(
                [call(0, "list_dir", {"path": "."}, duration_ms=-1.0), final(1)], rollout=51
            ),
            "integrity.negative_step_duration",
        ),
        (
            trajectory([list_step(0), final(1)], rollout=52, duration_s=-1.0),
            "integrity.negative_episode_duration",
        ),
    ],
)
def test_integrity_failures_fail_the_batch(config: QcConfig, bad: Trajectory, check: str) -> None:
    report = run_gate([oracle(rollout=i) for i in range(4)] + [bad], config=config)
    assert [c.expectation for c in report.batch_failures] == [check]


def test_no_success_fails_the_batch(config: QcConfig) -> None:
    report = run_gate([oracle(rollout=i, score=0.0) for i in range(3)], config=config)
    assert [c.expectation for c in report.batch_failures] == ["result.no_success"]
    assert report.counts["keep"] == 3 and set(report.verdicts["reward_sign"].to_list()) == {-1}


def test_the_format_line(config: QcConfig) -> None:
    """Recovered blemishes downweight; majority-unparseable, unrecovered or parse-failure endings discard."""
    recovered = PERTURBATIONS["malformed"](rollout=1)
    half = trajectory(
        [parse_error(0, "a"), list_step(1), read_step(2), parse_error(3, "b"), final(4)], rollout=2
    )
    majority = trajectory(
        [parse_error(0, "a"), parse_error(1, "b"), parse_error(2, "c"), list_step(3), final(4)],
        rollout=3,
        score=0.0,
    )
    unrecovered = trajectory(
        [list_step(0), read_step(1), parse_error(2, "c")],
        rollout=4,
        score=0.0,
        category=FailureCategory.MAX_STEPS,
    )
    ended = trajectory(
        [list_step(0), parse_error(1, "a"), list_step(2)],
        rollout=5,
        score=0.0,
        category=FailureCategory.PARSE_FAILURES,
    )
    report = run_gate(
        [oracle(rollout=0), recovered, half, majority, unrecovered, ended], config=config
    )
    rows = verdict_rows(report)
    assert rows[str(recovered.episode_id)]["verdict"] == "downweight"
    assert rows[str(half.episode_id)]["verdict"] == "downweight"
    assert "format.parse_error_majority" in rows[str(majority.episode_id)]["reasons"]
    assert "format.unrecovered_parse_error" in rows[str(unrecovered.episode_id)]["reasons"]
    assert "format.ended_on_parse_failures" in rows[str(ended.episode_id)]["reasons"]
    for t in (majority, unrecovered, ended):
        assert rows[str(t.episode_id)]["verdict"] == "discard"


def test_gx_and_polars_reference_agree(
    noisy_report: tuple[GateReport, dict[str, str], list[Trajectory]], config: QcConfig
) -> None:
    _, _, episodes = noisy_report
    extra = [
        oracle(
            rollout=900,
            score=None,
            status=EpisodeStatus.ENV_ERROR,
            category=FailureCategory.ENV_ERROR,
        ),
        trajectory(
            [parse_error(0, "a"), parse_error(1, "b"), list_step(2)], rollout=901, score=0.0
        ),
    ]
    gx = run_gate([*episodes, *extra], config=config, engine="gx")
    pl_ref = run_gate([*episodes, *extra], config=config, engine="polars")
    key = ["episode_id"]
    norm = lambda r: r.verdicts.with_columns(pl.col("reasons").list.sort()).sort(key)  # noqa: E731
    assert norm(gx).equals(norm(pl_ref))
    assert [(c.expectation, c.success) for c in gx.batch_checks] == [
        (c.expectation, c.success) for c in pl_ref.batch_checks
    ]


def test_llm_judgements_replace_the_rubric_mean(config: QcConfig) -> None:
    t = oracle(rollout=0)
    grm = Judgement(
        episode_id=str(t.episode_id),
        judge="grm:judge-1",
        rubric=RubricScore(
            completion=5, tool_correctness=5, reliability=0, cost=5, safety=5, suggestion="x"
        ),
    )
    unparsed = Judgement(
        episode_id=str(oracle(rollout=1).episode_id),
        judge="grm:judge-1",
        parsed=False,
        parse_error="prose",
    )
    report = run_gate(
        [t, oracle(rollout=1)],
        config=config,
        judgements={grm.episode_id: grm, unparsed.episode_id: unparsed},
    )
    q = dict(zip(report.verdicts["episode_id"], report.verdicts["quality_score"], strict=True))
    assert q[str(t.episode_id)] == pytest.approx(0.8)
    assert (
        q[unparsed.episode_id] == 1.0
    )  # an unparsed answer is never scored: the rule judge's mean stays


def test_gx_errors_are_typed(config: QcConfig) -> None:
    trajectories = [oracle()]
    features = compute_features(
        build_frames(trajectories),
        judge_frame(judge_rows(trajectories, config)),
        gate=config.gate,
        rewards=config.rewards,
    )
    with pytest.raises(SuiteExecutionError, match="n_blind_writes"):
        evaluate_features(features.drop("n_blind_writes"), config=config)


def test_data_docs_are_built(config: QcConfig, tmp_path: Path) -> None:
    report = run_gate(
        [oracle(rollout=i) for i in range(3)] + [PERTURBATIONS["skipped_step"](rollout=9)],
        config=config,
        docs_dir=tmp_path / "docs",
    )
    assert report.data_docs_index == tmp_path / "docs" / "index.html"
    assert report.data_docs_index.is_file()
    assert any((tmp_path / "docs" / "validations").rglob("*.html"))


def test_the_gate_logs_nothing_of_gx_internals_at_info(
    config: QcConfig, caplog: pytest.LogCaptureFixture
) -> None:
    """GX's ephemeral context announces an unused temporary docs directory at INFO on every
    gate run; in the demo's terminal and the QC flow's run log that line is noise."""
    with caplog.at_level(logging.INFO):
        run_gate([oracle(rollout=i) for i in range(2)], config=config, engine="gx")
    assert not [r for r in caplog.records if r.name.startswith("great_expectations.data_context")]


def test_trigger_fires_once_across_gate_reruns(config: QcConfig) -> None:
    episodes, _ = noisy_collection()
    already = False
    fired = 0
    for _ in range(2):  # the gate re-runs on the same collection run
        report = run_gate(episodes, config=config, engine="polars")
        if should_trigger_training(
            report.quality_weighted_volume,
            10.0,
            batch_passed=report.batch_passed,
            already_triggered_for_this_run=already,
        ):
            fired += 1
            already = True
    assert fired == 1
