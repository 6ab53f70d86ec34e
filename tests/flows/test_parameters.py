"""The run forms Prefect renders from the flows' signatures: every parameter and every
field of the request, sandbox spec, gate and evaluation options has a description, and
the closed choices (policy and fault presets, trigger mode, algorithm) are enums — the
form's dropdowns. The CLI's strings still validate into the same request."""

from __future__ import annotations

from typing import Any

import pytest
from prefect.utilities.callables import parameter_schema

from collection.errors import CollectError
from collection.request import CollectRequest


def _schemas() -> dict[str, dict[str, Any]]:
    from flows.collect import collect_episodes
    from flows.evaluate import evaluate
    from flows.qc import qc_gate
    from flows.shard import collect_shard
    from flows.train import train

    return {
        f.name: parameter_schema(f).model_dump()
        for f in (collect_episodes, collect_shard, qc_gate, train, evaluate)
    }


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    ref = node.get("$ref")
    return schema["definitions"][ref.rsplit("/", 1)[-1]] if ref else node


def _enums(schema: dict[str, Any], node: dict[str, Any]) -> list[list[str]]:
    node = _resolve(schema, node)
    found = [node["enum"]] if "enum" in node else []
    for option in node.get("anyOf", []):
        found += _enums(schema, option)
    return found


def test_every_parameter_and_field_has_help_text() -> None:
    for name, schema in _schemas().items():
        for parameter, prop in schema["properties"].items():
            assert prop.get("description"), (name, parameter)
        for model, definition in schema.get("definitions", {}).items():
            for field, prop in definition.get("properties", {}).items():
                assert prop.get("description"), (name, model, field)


def test_closed_choices_are_dropdowns() -> None:
    schemas = _schemas()
    collect = schemas["collect-episodes"]
    request = collect["definitions"]["CollectRequest"]["properties"]
    assert ["scripted:oracle", "scripted:noisy", "scripted:idle"] in _enums(
        collect, request["policy"]
    )
    assert ["none", "light", "heavy"] in _enums(collect, request["faults"])
    gate = collect["definitions"]["GateOptions"]["properties"]
    assert ["deployment", "inline", "none"] in _enums(collect, gate["trigger"])
    assert ["deployment", "inline", "none"] in _enums(
        schemas["qc-gate"], schemas["qc-gate"]["properties"]["trigger"]
    )
    train = schemas["train"]
    assert ["sft", "dpo", "kto", "grpo"] in _enums(train, train["properties"]["algo"])
    spec = collect["definitions"]["SandboxSpec"]["properties"]
    assert ["none", "loopback"] in _enums(collect, spec["network"])


def test_gate_settings_are_parameters_with_env_defaults() -> None:
    qc = _schemas()["qc-gate"]["properties"]
    for name in ("training_threshold", "train_max_steps", "train_max_time_s", "evaluation"):
        assert name in qc
    assert "EPIFLOW_QUALITY_TRAINING_TRIGGER_VOLUME" in qc["training_threshold"]["description"]


def test_cli_strings_still_validate() -> None:
    request = CollectRequest.from_options(policy="scripted:noisy?malformed=0.3", faults="light")
    assert request.policy == "scripted:noisy?malformed=0.3" and request.faults == "light"
    custom = CollectRequest.from_options(faults='{"latency_p": 0.5}')
    assert custom.fault_profile is not None and custom.fault_profile.latency_p == 0.5
    assert CollectRequest.from_options(faults="none").fault_profile is None
    with pytest.raises(CollectError, match=r"--faults: unknown fault profile 'medium'"):
        CollectRequest.from_options(faults="medium")
    with pytest.raises(CollectError, match="--policy: must not be blank"):
        CollectRequest.from_options(policy=" ")
    # the request round-trips through the JSON a deployment run carries
    dumped = custom.model_dump(mode="json")
    assert CollectRequest.model_validate(dumped) == custom


def test_run_keys_mean_one_thing() -> None:
    """The nightly schedule's runs are keyed by their night (a retry or a recovery of the
    same flow run keeps it); any other run without a key gets its flow run's own; an
    explicit key always wins."""
    import uuid
    from datetime import UTC, datetime

    from prefect.client.schemas.objects import FlowRun

    from collection.request import CollectRequest
    from flows.collect import flow_run_key

    request = CollectRequest(suite="builtin", policy="scripted:noisy")
    night = datetime(2026, 12, 1, 2, 0, tzinfo=UTC)
    scheduled = FlowRun(
        flow_id=uuid.uuid4(),
        deployment_id=uuid.uuid4(),
        auto_scheduled=True,
        expected_start_time=night,
    )
    assert flow_run_key(request, scheduled) == "builtin-scripted-noisy-20261201"
    retried = scheduled.model_copy(update={"run_count": 3})
    assert flow_run_key(request, retried) == "builtin-scripted-noisy-20261201"

    manual = FlowRun(flow_id=uuid.uuid4(), deployment_id=uuid.uuid4(), expected_start_time=night)
    assert flow_run_key(request, manual) == f"builtin-scripted-noisy-{manual.id.hex[:8]}"
    assert flow_run_key(request, manual) == flow_run_key(request, manual)  # stable per flow run

    fresh = {flow_run_key(request, None) for _ in range(3)}
    assert len(fresh) == 3 and all(k.startswith("builtin-scripted-noisy-") for k in fresh)
    assert flow_run_key(request.keyed("mine"), scheduled) == "mine"
