"""Fixtures for the gate tests: the four settings built explicitly, and gated collections."""

from __future__ import annotations

import pytest

from expectations.settings import GateSettings, QcConfig
from scoring.settings import QualitySettings, RewardSettings, RuleJudgeSettings


@pytest.fixture
def config() -> QcConfig:
    return QcConfig(
        gate=GateSettings(),
        rewards=RewardSettings(),
        judge=RuleJudgeSettings(),
        quality=QualitySettings(),
    )
