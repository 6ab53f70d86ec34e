"""One source of deployments (issue 13 item 5): `prefect.yaml` is what
`flows/deployments.py` renders; the served deployments and the work-pool ones agree on
everything but their names and pools, and their names never collide; entrypoints are
importable module paths, so nothing depends on where `prefect deploy` ran."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from flows.deployments import DEPLOYMENTS, TARGETS, prefect_yaml, runner_deployments

ROOT = Path(__file__).resolve().parents[2]


def test_prefect_yaml_is_generated_from_the_definitions() -> None:
    assert (ROOT / "prefect.yaml").read_text() == prefect_yaml(), (
        "prefect.yaml is stale: run `epiflow prefect yaml > prefect.yaml`"
    )


def _strip_target(name: str) -> str:
    for target in TARGETS.values():
        if target.suffix and name.endswith(target.suffix):
            return name.removesuffix(target.suffix)
    return name


def _normalise(parameters: dict[str, Any]) -> dict[str, Any]:
    """Parameters with the target's deployment references reduced to their base names."""
    text = yaml.safe_dump(parameters, sort_keys=True)
    for target in TARGETS.values():
        if target.suffix:
            text = text.replace(f"shard{target.suffix}", "shard").replace(
                f"train{target.suffix}", "train"
            )
    return dict(yaml.safe_load(text))


def test_served_and_pool_deployments_agree_and_never_collide() -> None:
    document = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    assert document["pull"] == []  # no step that would freeze a path at deploy time
    assert "{{" not in (ROOT / "prefect.yaml").read_text()
    pooled = document["deployments"]
    served = runner_deployments()

    # Distinct names: (flow, name) pairs never shared between serve and a pool.
    names = [d.name for d in served] + [d["name"] for d in pooled]
    assert len(names) == len(set(names))
    assert {d.name for d in served} == {s.name for s in DEPLOYMENTS}

    by_base: dict[str, list[dict[str, Any]]] = {}
    for entry in pooled:
        by_base.setdefault(_strip_target(entry["name"]), []).append(entry)
    assert set(by_base) == {s.name for s in DEPLOYMENTS}
    for deployment in served:
        entries = by_base[deployment.name]
        assert {e["work_pool"]["name"] for e in entries} == {"epiflow-process", "epiflow-k8s"}
        for entry in entries:
            assert entry["entrypoint"] == deployment.entrypoint
            assert entry["description"] == deployment.description
            assert entry["tags"] == deployment.tags
            assert _normalise(entry["parameters"]) == _normalise(deployment.parameters)
            crons = [s["cron"] for s in entry["schedules"]]
            assert crons == [s.schedule.cron for s in deployment.schedules]


def test_entrypoints_are_importable_flows_with_the_schedule_where_expected() -> None:
    from prefect import Flow
    from prefect.utilities.importtools import import_object

    for spec in DEPLOYMENTS:
        assert ":" not in spec.entrypoint and not spec.entrypoint.endswith(".py")
        assert isinstance(import_object(spec.entrypoint), Flow), spec.entrypoint
    nightly = import_object("flows.collect.nightly_collect_episodes")
    assert nightly.name == "collect-episodes" and nightly.retries == 2
    document = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    active = {
        d["name"]: d["schedules"][0]["active"] for d in document["deployments"] if d["schedules"]
    }
    # Two nightly schedules per route (exploration and the champion), active on the process
    # pool; the Kubernetes ones are switched on by their operator.
    assert active == {
        "nightly-collect-process": True,
        "nightly-champion-process": True,
        "nightly-collect-k8s": False,
        "nightly-champion-k8s": False,
    }


def test_the_champion_collects_beside_the_exploration_policy_and_the_chain_promotes() -> None:
    """The champion's night is the exploration night's request played by `hf:alias/champion`
    (falling back to the base model, else the exploration policy, while the alias is
    unset), and both nights' triggered trainings are evaluated against the champion and
    promoted by the rule."""
    served = {d.name: d.parameters for d in runner_deployments()}
    exploring, champion = served["nightly-collect"], served["nightly-champion"]
    assert exploring["request"]["policy"] == "scripted:noisy"
    assert champion["request"] == {**exploring["request"], "policy": "hf:alias/champion"}
    assert champion["alias_fallback"] == "scripted:noisy" and "alias_fallback" not in exploring
    for night in (exploring, champion):
        assert night["gate_options"]["evaluation"]["promote_alias"] == "champion"


def test_gate_and_shards_point_at_their_own_targets_deployments() -> None:
    document = yaml.safe_load((ROOT / "prefect.yaml").read_text())
    for entry in document["deployments"]:
        suffix = entry["work_pool"]["name"].removeprefix("epiflow")
        parameters = entry["parameters"]
        if entry["name"].startswith(("nightly-collect", "nightly-champion")):
            assert parameters["shard_deployment"] == f"collect-shard/shard{suffix}"
            assert parameters["gate_options"]["train_deployment"] == f"train/train{suffix}"
        if entry["name"].startswith("qc-gate"):
            assert parameters["train_deployment"] == f"train/train{suffix}"


def test_operators_run_the_production_monitor_from_the_ui_on_demand() -> None:
    """The `monitor` deployment: the champion's alias by default, the window named in the run
    form, no schedule (no fixed parameter names each day's window), a breach announced."""
    from prefect.utilities.importtools import import_object

    from orchestration.automations import NOTIFY_TAG

    served = {d.name: d for d in runner_deployments()}
    monitor = served["monitor"]
    assert monitor.entrypoint == "flows.monitor.monitor"
    assert monitor.parameters == {"alias": "champion", "rollback": False}
    assert not monitor.schedules
    assert NOTIFY_TAG in monitor.tags
    # The run form: the flow's parameters, the window among them.
    form = import_object(monitor.entrypoint).parameters.properties
    assert {"alias", "run", "file", "fmt", "rollback", "min_episodes"} <= set(form)
