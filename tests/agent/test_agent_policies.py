"""Policy spec strings and the scripted policies' behaviour outside the loop."""

from __future__ import annotations

import asyncio

import pytest

from agent.errors import PolicySpecError
from agent.policies import (
    HFPolicy,
    IdlePolicy,
    NoisyPolicy,
    OpenAIPolicy,
    OraclePolicy,
    PolicyRequest,
    make_policy,
)
from agent.protocol import parse_message
from agent.settings import NoisyRates, PolicySettings
from agent.trajectory import ParseKind
from sandbox.tool_specs import BUILTIN_TOOLS


def test_spec_strings_build_the_right_policy() -> None:
    assert isinstance(make_policy("scripted:oracle", settings=PolicySettings()), OraclePolicy)
    assert isinstance(make_policy("scripted:idle", settings=PolicySettings()), IdlePolicy)
    noisy = make_policy("scripted:noisy?malformed=0.5&skipped_step=0", settings=PolicySettings())
    assert isinstance(noisy, NoisyPolicy)
    assert noisy.rates.malformed == 0.5 and noisy.rates.skipped_step == 0.0
    assert noisy.rates.unknown_tool == NoisyRates().unknown_tool
    endpoint = make_policy(
        "openai:http://127.0.0.1:8000/v1#qwen?temperature=0.7&native_tools=true&max_retries=1",
        settings=PolicySettings(),
    )
    assert isinstance(endpoint, OpenAIPolicy)
    assert (endpoint.base_url, endpoint.model) == ("http://127.0.0.1:8000/v1", "qwen")
    assert (
        endpoint.settings.temperature == 0.7
        and endpoint.settings.native_tools
        and endpoint.settings.max_retries == 1
    )
    local = make_policy("hf:/models/tiny", settings=PolicySettings())
    assert isinstance(local, HFPolicy) and str(local.path) == "/models/tiny"
    assert make_policy("scripted:oracle", settings=PolicySettings()).spec == "scripted:oracle"


def test_settings_flow_into_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EPIFLOW_AGENT_NOISY_MALFORMED", "0.9")
    noisy = make_policy("scripted:noisy", settings=PolicySettings())
    assert isinstance(noisy, NoisyPolicy) and noisy.rates.malformed == 0.9


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("oracle", "scheme"),
        ("scripted:genius", "expected scripted"),
        ("scripted:oracle?x=1", "expected scripted"),
        ("scripted:noisy?bogus=0.1", "unknown perturbation"),
        ("scripted:noisy?malformed=2", r"in \[0, 1\]"),
        ("scripted:noisy?malformed=lots", "number"),
        ("scripted:noisy?malformed=0.1&malformed=0.2", "twice"),
        ("openai:127.0.0.1:8000#m", "http"),
        ("openai:http://h/v1", "http"),
        ("openai:http://h/v1#m?colour=red", "unknown key"),
        ("openai:http://h/v1#m?temperature=hot", "temperature"),
        ("hf:", "checkpoint"),
        ("magic:x", "unknown scheme"),
    ],
)
def test_bad_spec_strings(spec: str, message: str) -> None:
    with pytest.raises(PolicySpecError, match=message):
        make_policy(spec, settings=PolicySettings())


def test_oracle_and_idle_speak_valid_protocol(task) -> None:
    request = PolicyRequest(task=task, messages=[], tools=list(BUILTIN_TOOLS.values()))
    oracle = asyncio.run(make_policy("scripted:oracle", settings=PolicySettings()).respond(request))
    parsed = parse_message(oracle.text, BUILTIN_TOOLS)
    assert parsed.call is not None and parsed.call.tool == task.reference_solution[0].tool
    idle = asyncio.run(make_policy("scripted:idle", settings=PolicySettings()).respond(request))
    assert parse_message(idle.text, BUILTIN_TOOLS).kind == ParseKind.FINAL


def test_noisy_draws_are_seeded(task) -> None:
    policy = make_policy("scripted:noisy?malformed=0.5&unknown_tool=0.5", settings=PolicySettings())

    def texts(seed: int) -> list[str]:
        return [
            asyncio.run(
                policy.respond(
                    PolicyRequest(
                        task=task,
                        messages=[],
                        tools=list(BUILTIN_TOOLS.values()),
                        step_index=i,
                        seed=seed,
                    )
                )
            ).text
            for i in range(8)
        ]

    assert texts(1) == texts(1)
    assert texts(1) != texts(2)
