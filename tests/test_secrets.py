"""Secrets in any subsystem's settings never show in reprs or dumps."""

from __future__ import annotations

import pytest

from agent.settings import PolicySettings
from scoring.settings import GrmSettings


def test_api_keys_are_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPIFLOW_AGENT_POLICY_API_KEY", "sk-policy-secret")
    monkeypatch.setenv("EPIFLOW_GRM_API_KEY", "sk-judge-secret")
    policy, judge = PolicySettings(), GrmSettings()
    shown = (
        repr(policy)
        + str(policy)
        + repr(judge)
        + str(judge.model_dump())
        + policy.model_dump_json()
    )
    assert "sk-policy-secret" not in shown and "sk-judge-secret" not in shown
    assert policy.api_key is not None and policy.api_key.get_secret_value() == "sk-policy-secret"
    assert judge.api_key is not None and judge.api_key.get_secret_value() == "sk-judge-secret"
