"""Fixtures for the scoring tests: settings built explicitly, never from the environment."""

from __future__ import annotations

import pytest

from scoring.settings import GrmSettings, QualitySettings, RewardSettings, RuleJudgeSettings


@pytest.fixture
def reward_settings() -> RewardSettings:
    return RewardSettings()


@pytest.fixture
def judge_settings() -> RuleJudgeSettings:
    return RuleJudgeSettings()


@pytest.fixture
def quality_settings() -> QualitySettings:
    return QualitySettings()


@pytest.fixture
def grm_settings() -> GrmSettings:
    return GrmSettings()
