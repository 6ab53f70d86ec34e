"""The qc-gate's markdown artifact (`reports.gate_summary.gate_markdown`): the gate's report,
then the LLM judge's unscored episodes, the trigger decision with a link to the training,
and the gate runs the training draws on. Formats only: no Prefect, no SQL."""

from __future__ import annotations

import uuid

import pytest

from expectations.gate import run_gate
from expectations.report import GateReport, render_markdown
from expectations.settings import GateSettings, QcConfig
from reports.gate_summary import gate_markdown
from scoring.settings import QualitySettings, RewardSettings, RuleJudgeSettings
from tests.scoring.qc_builders import oracle

Q1, Q2 = uuid.UUID(int=1), uuid.UUID(int=2)


@pytest.fixture(scope="module")
def report() -> GateReport:
    config = QcConfig(
        gate=GateSettings(),
        rewards=RewardSettings(),
        judge=RuleJudgeSettings(),
        quality=QualitySettings(),
    )
    return run_gate([oracle(rollout=i) for i in range(3)], config=config, engine="polars")


def test_no_training_and_nothing_unscored(report: GateReport) -> None:
    markdown = gate_markdown(
        report,
        volume=12.5,
        threshold=500.0,
        training_link=None,
        training_deployment=None,
        training_qc_runs=[],
        grm_unscored=0,
    )
    assert markdown == (
        render_markdown(report) + "\n\nQuality-weighted volume since the last training: "
        "**12.5** (threshold 500.0); training triggered: **no**.\n"
    )


def test_a_triggered_training_is_linked_with_its_deployment_and_gate_runs(
    report: GateReport,
) -> None:
    markdown = gate_markdown(
        report,
        volume=512.0,
        threshold=500.0,
        training_link="[abc](http://ui/runs/abc)",
        training_deployment="train/train",
        training_qc_runs=[Q1, Q2],
        grm_unscored=2,
    )
    assert markdown == (
        render_markdown(report)
        + "\n\nLLM judge: 2 episode(s) unscored (the rule judge stands)."
        + "\n\nQuality-weighted volume since the last training: **512.0** (threshold 500.0); "
        "training triggered: **yes, [abc](http://ui/runs/abc) (deployment `train/train`)**.\n"
        f"\nThe training draws on 2 gate run(s): `{Q1}`, `{Q2}`.\n"
    )
