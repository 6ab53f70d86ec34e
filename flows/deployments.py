"""Every deployment, defined once (`DEPLOYMENTS`), rendered for each place it runs.

Targets (`TARGETS`) keep their deployments apart by name, so that `epiflow serve` and
`prefect deploy` never rewrite each other's, and stopping `serve` (which pauses the
schedules it served) leaves the work pools' alone:

| target    | how                                  | names               | nightly schedule |
|-----------|--------------------------------------|---------------------|------------------|
| `serve`   | `epiflow serve` (one process)        | `nightly-collect`   | active           |
| `process` | `prefect deploy`, pool epiflow-process | `nightly-collect-process` | active     |
| `k8s`     | `prefect deploy`, pool epiflow-k8s   | `nightly-collect-k8s` | paused (activate the one you use) |

`runner_deployments()` builds the served ones; `prefect_yaml()` renders `prefect.yaml`
(`epiflow prefect yaml > prefect.yaml`; a test keeps the file and this module in step).
Entrypoints are module paths (`flows.collect.collect_episodes`) and `prefect.yaml` has no
pull step: a worker imports the installed epiflow package, wherever its working directory
is, and nothing is frozen at deploy time. Parameters that name another deployment (the
gate's training trigger, the shards) name the same target's.

Two nightly deployments share the schedule (each one night at a time): `nightly-collect`
explores with the configured policy (`NIGHTLY_REQUEST`), `nightly-champion` collects the
same request with the current champion (`hf:alias/champion`: on-policy rollouts of the
best model so far; before the first promotion, the base model, else the exploration
policy, with a log line saying so). Both are gated into the same training trigger window,
and the training they trigger is evaluated against the champion and promoted when the
rule says so (`evaluation.promote_alias`): train → evaluate → promote, and the next night
collects with what won.

`monitor` runs the production monitor (`flows.monitor`) on demand: the operator names the
window (`run`, the key an import of production traces or a collection against the serving
endpoint stored; or `file`) in the run form, the alias defaults to the champion. It has no
schedule: the window is not something the nightly chain produces, so no fixed parameter
could name each day's (docs/models.md, "The production monitor").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from orchestration.automations import NOTIFY_TAG, RECOVER_TAG

NIGHTLY_CRON = "0 2 * * *"
"""02:00 UTC every night."""


NIGHTLY_REQUEST: dict[str, Any] = {
    "suite": "builtin",
    "policy": "scripted:noisy",
    "tasks": 4,
    "rollouts": 2,
    "concurrency": 8,
    "faults": "light",
}
"""What the nightly collection runs; override per run in the UI."""

CHAMPION_ALIAS = "champion"
"""The model alias the nightly chain promotes and the champion's night collects with."""

NIGHTLY_CHAMPION_REQUEST: dict[str, Any] = {
    **NIGHTLY_REQUEST,
    "policy": f"hf:alias/{CHAMPION_ALIAS}",
}
"""What the champion's night runs: the nightly request (tasks, faults), played by the
champion."""


@dataclass(frozen=True)
class Target:
    """Where a set of deployments runs."""

    name: str
    """`serve`, `process` or `k8s`."""
    suffix: str
    """Appended to every deployment name of the target."""
    work_pool: str | None
    """The work pool (None: served by `epiflow serve`)."""
    schedule_active: bool
    """Whether the nightly schedule starts active."""


TARGETS: dict[str, Target] = {
    "serve": Target("serve", "", None, True),
    "process": Target("process", "-process", "epiflow-process", True),
    "k8s": Target("k8s", "-k8s", "epiflow-k8s", False),
}


def _no_parameters(target: Target) -> dict[str, Any]:
    return {}


@dataclass(frozen=True)
class DeploymentSpec:
    """One deployment, before it is given a target."""

    name: str
    """Base name (the served deployment's name; pool targets add their suffix)."""
    entrypoint: str
    """Module path of the flow object (`package.module.flow`)."""
    description: str
    tags: tuple[str, ...]
    parameters: Callable[[Target], dict[str, Any]] = field(default=_no_parameters)
    """Default parameters, for a target."""
    cron: str | None = None
    """Schedule (UTC), if any."""
    concurrency_limit: int | None = None
    """Flow runs of the deployment at once (more wait for a slot); None: no limit."""

    def deployment_name(self, target: Target) -> str:
        return self.name + target.suffix

    @property
    def flow_module(self) -> str:
        return self.entrypoint.rsplit(".", 1)[0]


def _nightly_parameters(target: Target) -> dict[str, Any]:
    return {
        "request": dict(NIGHTLY_REQUEST),
        "shard_deployment": f"collect-shard/shard{target.suffix}",
        "gate": True,
        "gate_options": {
            "train_deployment": f"train/train{target.suffix}",
            # Every builtin template once (13 task pairs, the rule asks for 8).
            "evaluation": {"instances": 1, "promote_alias": CHAMPION_ALIAS},
        },
    }


def _nightly_champion_parameters(target: Target) -> dict[str, Any]:
    return {
        **_nightly_parameters(target),
        "request": dict(NIGHTLY_CHAMPION_REQUEST),
        "alias_fallback": NIGHTLY_REQUEST["policy"],
    }


def _monitor_parameters(target: Target) -> dict[str, Any]:
    return {"alias": CHAMPION_ALIAS, "rollback": False}


def _gate_parameters(target: Target) -> dict[str, Any]:
    return {"train_deployment": f"train/train{target.suffix}"}


DEPLOYMENTS: tuple[DeploymentSpec, ...] = (
    DeploymentSpec(
        name="nightly-collect",
        entrypoint="flows.collect.nightly_collect_episodes",
        description=(
            "Nightly episode collection on the built-in suite, then the QC gate. Runs are "
            "named by date; a failed night is retried and a crashed one recovered, resuming "
            "its run key."
        ),
        tags=("epiflow", "collect", RECOVER_TAG, NOTIFY_TAG),
        parameters=_nightly_parameters,
        cron=NIGHTLY_CRON,
        # One night at a time: a late or recovered night never runs beside the next.
        concurrency_limit=1,
    ),
    DeploymentSpec(
        name="nightly-champion",
        entrypoint="flows.collect.nightly_collect_episodes",
        description=(
            "Nightly collection by the current champion (hf:alias/champion; the base model, "
            "else the exploration policy, until a checkpoint is promoted), then the QC gate: "
            "the on-policy half of the night."
        ),
        tags=("epiflow", "collect", RECOVER_TAG, NOTIFY_TAG),
        parameters=_nightly_champion_parameters,
        cron=NIGHTLY_CRON,
        concurrency_limit=1,
    ),
    DeploymentSpec(
        name="shard",
        entrypoint="flows.shard.collect_shard",
        description="One shard of a collection run (scale-out); its parent retries it.",
        # Notified like a night: a shard no worker starts (Late) leaves its parent waiting.
        tags=("epiflow", "collect", NOTIFY_TAG),
    ),
    DeploymentSpec(
        name="qc-gate",
        entrypoint="flows.qc.qc_gate",
        description="Quality gate of a collection run.",
        tags=("epiflow", "qc"),
        parameters=_gate_parameters,
    ),
    DeploymentSpec(
        name="train",
        entrypoint="flows.train.train",
        description="Dataset snapshot, TRL trainer, checkpoint.",
        tags=("epiflow", "train", NOTIFY_TAG),
    ),
    DeploymentSpec(
        name="evaluate",
        entrypoint="flows.evaluate.evaluate",
        description="A checkpoint as a policy on held-out tasks in the sandbox.",
        tags=("epiflow", "evaluate", NOTIFY_TAG),
    ),
    DeploymentSpec(
        name="monitor",
        entrypoint="flows.monitor.monitor",
        description=(
            "Production monitor: a window of the deployed model's trajectories (a stored "
            "run, e.g. imported traces, or a trace file) against the champion's evaluation "
            "baseline; a breach is stored, announced (the run ends Failed) and, with "
            "rollback, rolls the alias back. On demand: name the window's run key."
        ),
        # Notified: a breach ends the run Failed, which the epiflow-notify automation posts.
        tags=("epiflow", "monitor", NOTIFY_TAG),
        parameters=_monitor_parameters,
    ),
)
"""The deployments, once."""


def runner_deployments() -> list[Any]:
    """The `serve` target's `RunnerDeployment`s, for `prefect.serve` (one process, no
    work pool)."""
    from prefect.schedules import Cron
    from prefect.types.entrypoint import EntrypointType
    from prefect.utilities.importtools import import_object

    target = TARGETS["serve"]
    built = []
    for spec in DEPLOYMENTS:
        flow = import_object(spec.entrypoint)
        deployment = flow.to_deployment(
            name=spec.deployment_name(target),
            schedules=[Cron(spec.cron, timezone="UTC", active=target.schedule_active)]
            if spec.cron
            else None,
            parameters=spec.parameters(target),
            description=spec.description,
            tags=list(spec.tags),
            concurrency_limit=spec.concurrency_limit,
            entrypoint_type=EntrypointType.MODULE_PATH,
        )
        # The flow object's own path (`with_options` copies keep their function's name).
        deployment.entrypoint = spec.entrypoint
        built.append(deployment)
    return built


def pool_deployments() -> list[dict[str, Any]]:
    """The work-pool targets' deployments, as `prefect.yaml` entries."""
    entries: list[dict[str, Any]] = []
    for target in TARGETS.values():
        if target.work_pool is None:
            continue
        for spec in DEPLOYMENTS:
            entry: dict[str, Any] = {
                "name": spec.deployment_name(target),
                "entrypoint": spec.entrypoint,
                "description": spec.description,
                "tags": list(spec.tags),
                "parameters": spec.parameters(target),
                "schedules": [
                    {"cron": spec.cron, "timezone": "UTC", "active": target.schedule_active}
                ]
                if spec.cron
                else [],
                "work_pool": {"name": target.work_pool, "work_queue_name": "default"},
            }
            if spec.concurrency_limit is not None:
                entry["concurrency_limit"] = spec.concurrency_limit
            entries.append(entry)
    return entries


YAML_HEADER = """\
# Generated from flows/deployments.py by `epiflow prefect yaml > prefect.yaml`: edit that
# module, not this file (tests/flows/test_deployments.py keeps them in step).
#
# The work-pool deployments: `<name>-process` on the process pool, `<name>-k8s` on the
# Kubernetes pool (its nightly schedule starts paused). `epiflow serve` serves the same
# deployments under their plain names, so neither route rewrites the other's.
#
#   prefect work-pool create epiflow-process --type process
#   prefect deploy --all
#   prefect worker start --pool epiflow-process      # one per machine, any directory
#
# Entrypoints are module paths and there is no pull step: a worker imports the installed
# epiflow package (the worker image, or `make install`), so nothing here depends on the
# directory `prefect deploy` ran in.
"""


def prefect_yaml() -> str:
    """`prefect.yaml`'s text: header, project, no build/push/pull steps, deployments."""
    import yaml
    from prefect import __version__ as prefect_version

    document = {
        "name": "epiflow",
        "prefect-version": prefect_version,
        "build": None,
        "push": None,
        "pull": [],
        "deployments": pool_deployments(),
    }
    return YAML_HEADER + yaml.safe_dump(document, sort_keys=False, width=100)
