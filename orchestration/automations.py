"""Crash detection, recovery and notification: Prefect automations that epiflow sets up
(`epiflow prefect setup`; `epiflow serve` runs it at start). Idempotent: each automation
is created or updated by its name, so running setup again applies changed settings.

How a crashed run is seen and recovered:

1. Every flow run sends a heartbeat event (`prefect.flow-run.heartbeat`) every
   PREFECT_FLOWS_HEARTBEAT_FREQUENCY seconds (`EPIFLOW_PREFECT_HEARTBEAT_S`, default 60,
   for runs epiflow starts; the worker image sets it for workers).
2. `ZOMBIE`: a flow run that sent a heartbeat, or went Pending or Running, and then, for
   `zombie_after_s`, neither sent another heartbeat, nor started, nor reached a state
   that ends or pauses its process, is marked **Crashed** (its process died: SIGKILL, out
   of memory, a machine or pod lost). Pending counts: a worker that dies between taking a
   run (Pending) and its process's first heartbeat leaves no heartbeat to miss, and the
   run would stay Pending forever (a sharded run's parent waiting on it with it). A
   worker whose runs take longer than `zombie_after_s` to start (an image pull) needs a
   longer `zombie_after_s`.
3. `STUCK_CANCEL`: a cancellation no process confirms within `zombie_after_s` (the
   process that would have confirmed it is gone) is marked **Cancelled**.
4. `RECOVER`: a flow run tagged `epiflow-recover` (the nightly deployments) that turns
   Crashed is put back to **Scheduled** (`AwaitingRetry`) — the same flow run, so
   `serve` or a worker starts it again and it computes the same run key, which resumes:
   stored episodes are skipped, only the missing ones run. Its run-key lock died with the
   crashed process, so nothing blocks it. A run started more often than its retries allow
   ends Failed instead (`flows.collect`), so a run that crashes every time stops.
5. `NOTIFY` (with `notify_webhook_url`): a flow run tagged `epiflow-notify` (the nightly
   and shard deployments, and the train and evaluate deployments and the evaluation a
   training runs, and `epiflow models monitor`'s runs: a production-monitor breach ends
   its run Failed) that ends Failed or Crashed is announced with a JSON POST to the webhook,
   through the `epiflow-notify` Custom Webhook block.
6. `LATE` (with `notify_webhook_url`): a flow run tagged `epiflow-notify` that Prefect
   marked Late (still Scheduled 15 s after its time) and that has not started
   `late_after_s` later is announced too: nothing serves its deployment (`epiflow serve`
   or the pool's worker is down), so the night would otherwise pass in silence.

A failed (not crashed) nightly attempt is retried by Prefect itself (the flow's retries),
in the same process and again on the same key.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any
from uuid import UUID

from config.settings import PrefectSettings

RECOVER_TAG = "epiflow-recover"
"""Flow runs with this tag are scheduled again when they crash (the nightly deployments)."""
NOTIFY_TAG = "epiflow-notify"
"""Flow runs with this tag that end Failed or Crashed, or start late, are announced to
the webhook."""

ZOMBIE = "epiflow: crashed when silent"
STUCK_CANCEL = "epiflow: cancelled when unconfirmed"
RECOVER = "epiflow: start crashed nightly runs again"
NOTIFY = "epiflow: notify failed nightly runs"
LATE = "epiflow: notify late nightly runs"
NOTIFY_BLOCK = "epiflow-notify"
"""Name of the Custom Webhook block the notification automation posts through."""

_FINAL = ("Completed", "Failed", "Cancelled", "Crashed")
# States in which a live flow run stops sending heartbeats: the end, a cancellation in
# progress, a retry's wait, a pause.
_QUIET = (*_FINAL, "Cancelling", "AwaitingRetry", "Paused", "Suspended")
# States that start the silence the zombie automation watches: taken by a worker or
# runner (its process is about to start) and started (its first heartbeat is due).
_STARTING = ("Pending", "Running")
# States of a flow run that is no longer waiting to start.
_STARTED = (*_FINAL, "Pending", "Running", "Cancelling")


@dataclass(frozen=True)
class SetupReport:
    """What `ensure_automations` did."""

    created: list[str]
    updated: list[str]
    deleted: list[str]

    def line(self) -> str:
        parts = [
            f"{verb} {', '.join(names)}"
            for verb, names in (
                ("created", self.created),
                ("updated", self.updated),
                ("removed", self.deleted),
            )
            if names
        ]
        return "; ".join(parts) or "nothing to change"


def _flow_run_events(*states: str) -> set[str]:
    return {f"prefect.flow-run.{state}" for state in states}


def automations(settings: PrefectSettings, notify_block: UUID | None) -> list[Any]:
    """The automations for these settings (`notify_block`: the webhook block's id, when a
    webhook is configured)."""
    from prefect.automations import (
        AutomationCore,
        ChangeFlowRunState,
        EventTrigger,
        Posture,
        SendNotification,
    )
    from prefect.client.schemas.objects import StateType

    silent = timedelta(seconds=settings.zombie_after_s)
    every_flow_run = {"prefect.resource.id": ["prefect.flow-run.*"]}
    wanted = [
        AutomationCore(
            name=ZOMBIE,
            description=(
                "A flow run that sent a heartbeat, or went Pending or Running, and then "
                f"stayed silent for {settings.zombie_after_s:g} s lost its process: mark it "
                "Crashed."
            ),
            trigger=EventTrigger(
                after={"prefect.flow-run.heartbeat"} | _flow_run_events(*_STARTING),
                expect={"prefect.flow-run.heartbeat"} | _flow_run_events("Running", *_QUIET),
                match=every_flow_run,
                for_each={"prefect.resource.id"},
                posture=Posture.Proactive,
                threshold=1,
                within=silent,
            ),
            actions=[
                ChangeFlowRunState(
                    state=StateType.CRASHED,
                    message=(
                        f"no heartbeat for {settings.zombie_after_s:g} s: the process running "
                        "(or starting) this flow run died (killed, out of memory, machine lost)"
                    ),
                )
            ],
        ),
        AutomationCore(
            name=STUCK_CANCEL,
            description=(
                "A cancellation that no process confirms within "
                f"{settings.zombie_after_s:g} s: mark the flow run Cancelled."
            ),
            trigger=EventTrigger(
                after={"prefect.flow-run.Cancelling"},
                expect=_flow_run_events(*_FINAL),
                match=every_flow_run,
                for_each={"prefect.resource.id"},
                posture=Posture.Proactive,
                threshold=1,
                within=silent,
            ),
            actions=[
                ChangeFlowRunState(
                    state=StateType.CANCELLED,
                    message="cancelled: the process that ran it is gone and never confirmed",
                )
            ],
        ),
        AutomationCore(
            name=RECOVER,
            description=(
                f"A crashed flow run tagged {RECOVER_TAG} is scheduled again; it resumes its "
                "run key."
            ),
            trigger=EventTrigger(
                expect={"prefect.flow-run.Crashed"},
                match=every_flow_run,
                match_related={"prefect.resource.id": f"prefect.tag.{RECOVER_TAG}"},
                posture=Posture.Reactive,
                threshold=1,
                within=timedelta(0),
            ),
            actions=[
                ChangeFlowRunState(
                    state=StateType.SCHEDULED,
                    name="AwaitingRetry",
                    force=True,
                    message="crashed: scheduled again by epiflow's recovery; it resumes its run key",
                )
            ],
        ),
    ]
    if notify_block is not None:
        wanted.append(
            AutomationCore(
                name=NOTIFY,
                description=f"A flow run tagged {NOTIFY_TAG} ended Failed or Crashed: post to the webhook.",
                trigger=EventTrigger(
                    expect=_flow_run_events("Failed", "Crashed"),
                    match=every_flow_run,
                    match_related={"prefect.resource.id": f"prefect.tag.{NOTIFY_TAG}"},
                    posture=Posture.Reactive,
                    threshold=1,
                    within=timedelta(0),
                ),
                actions=[
                    SendNotification(
                        block_document_id=notify_block,
                        # From the event, not the flow run: a crashed run may already
                        # be scheduled again when this renders.
                        subject=(
                            "epiflow: flow run {{ event.resource['prefect.resource.name'] }} "
                            "{{ event.resource['prefect.state-name'] }}"
                        ),
                        body=(
                            "Flow run {{ event.resource['prefect.resource.name'] }} "
                            "({{ flow_run.id }}) of deployment {{ deployment.name }} ended "
                            "{{ event.resource['prefect.state-name'] }}: "
                            "{{ event.resource['prefect.state-message'] }}. A crashed nightly "
                            "run is started again automatically, a crashed or failed shard by "
                            "its parent; a failed nightly run has used its retries: fix the "
                            "cause, then re-run its run key."
                        ),
                    )
                ],
            )
        )
        wanted.append(
            AutomationCore(
                name=LATE,
                description=(
                    f"A flow run tagged {NOTIFY_TAG} marked Late that has not started "
                    f"{settings.late_after_s:g} s later: post to the webhook."
                ),
                trigger=EventTrigger(
                    after={"prefect.flow-run.Late"},
                    expect=_flow_run_events(*_STARTED),
                    match=every_flow_run,
                    match_related={"prefect.resource.id": f"prefect.tag.{NOTIFY_TAG}"},
                    for_each={"prefect.resource.id"},
                    posture=Posture.Proactive,
                    threshold=1,
                    within=timedelta(seconds=settings.late_after_s),
                ),
                actions=[
                    SendNotification(
                        block_document_id=notify_block,
                        subject=(
                            "epiflow: flow run {{ event.resource['prefect.resource.name'] }} "
                            "is late"
                        ),
                        body=(
                            "Flow run {{ event.resource['prefect.resource.name'] }} "
                            "({{ flow_run.id }}) of deployment {{ deployment.name }}, "
                            "scheduled for {{ flow_run.expected_start_time }}, has not "
                            f"started {settings.late_after_s:g} s after it was marked Late: "
                            "is `epiflow serve` (or the work pool's worker) running?"
                        ),
                    )
                ],
            )
        )
    return wanted


async def _save_notify_block(url: str) -> UUID:
    from prefect.blocks.notifications import CustomWebhookNotificationBlock

    block = CustomWebhookNotificationBlock(
        name="epiflow",
        url=url,
        method="POST",
        json_data={"text": "{{subject}}\n{{body}}", "subject": "{{subject}}", "body": "{{body}}"},
    )
    block_id: UUID = await block.asave(NOTIFY_BLOCK, overwrite=True)
    return block_id


async def ensure_automations(settings: PrefectSettings) -> SetupReport:
    """Create or update epiflow's automations (and the webhook block) in the Prefect API
    this process points at; remove the notification when no webhook is configured."""
    from prefect.client.orchestration import get_client

    url = settings.notify_webhook_url
    block = await _save_notify_block(url.get_secret_value()) if url is not None else None
    report = SetupReport(created=[], updated=[], deleted=[])
    async with get_client() as client:
        wanted = automations(settings, block)
        for automation in wanted:
            existing = await client.read_automations_by_name(automation.name)
            if existing:
                await client.update_automation(existing[0].id, automation)
                report.updated.append(automation.name)
                for extra in existing[1:]:  # duplicates from concurrent setups
                    await client.delete_automation(extra.id)
            else:
                await client.create_automation(automation)
                report.created.append(automation.name)
        if block is None:
            for name in (NOTIFY, LATE):
                for stale in await client.read_automations_by_name(name):
                    await client.delete_automation(stale.id)
                    report.deleted.append(name)
    return report


async def crash_detection_gap() -> str | None:
    """Why a flow run whose process dies would never be marked Crashed in the Prefect API
    this process points at: `ZOMBIE` not set up, disabled, or set up by an older epiflow
    (its silence counted only after a heartbeat). None when it would be."""
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        found = [a for a in await client.read_automations_by_name(ZOMBIE) if a.enabled]
    if not found:
        return f"the automation {ZOMBIE!r} is not set up (or disabled) in this Prefect API"
    starting = _flow_run_events(*_STARTING)
    if not any(starting <= set(getattr(a.trigger, "after", ())) for a in found):
        return (
            f"the automation {ZOMBIE!r} was set up by an older epiflow (a run killed before "
            "its first heartbeat is never marked Crashed)"
        )
    return None
