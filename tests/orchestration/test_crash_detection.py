"""`orchestration.automations.crash_detection_gap` against Prefect's real test harness: it names
what is wrong while the zombie automation is missing, disabled or set up by an older
epiflow (silence counted only after a heartbeat), and nothing once `ensure_automations`
set it up. The automations are removed again: the harness is shared by the session."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import pytest

from config.settings import PrefectSettings
from orchestration.automations import ZOMBIE, automations, crash_detection_gap, ensure_automations


async def _delete_all() -> None:
    from prefect.client.orchestration import get_client

    async with get_client() as client:
        for automation in await client.read_automations():
            await client.delete_automation(automation.id)


@pytest.fixture
def clean_automations(prefect_harness: None) -> Iterator[None]:
    asyncio.run(_delete_all())
    yield
    asyncio.run(_delete_all())


def test_the_gap_is_named_until_setup_closes_it(clean_automations: None) -> None:
    from prefect.client.orchestration import get_client

    settings = PrefectSettings()
    missing = asyncio.run(crash_detection_gap())
    assert missing is not None and ZOMBIE in missing and "not set up" in missing

    # What an epiflow before the Pending/Running silence set up: after a heartbeat only.
    zombie = next(a for a in automations(settings, None) if a.name == ZOMBIE)
    older = zombie.model_copy(
        update={
            "trigger": zombie.trigger.model_copy(update={"after": {"prefect.flow-run.heartbeat"}})
        }
    )

    async def create_older() -> None:
        async with get_client() as client:
            await client.create_automation(older)

    asyncio.run(create_older())
    stale = asyncio.run(crash_detection_gap())
    assert stale is not None and "older epiflow" in stale and "first heartbeat" in stale

    asyncio.run(ensure_automations(settings))  # updates it by name
    assert asyncio.run(crash_detection_gap()) is None

    async def disable() -> None:
        async with get_client() as client:
            (found,) = await client.read_automations_by_name(ZOMBIE)
            await client.pause_automation(found.id)

    asyncio.run(disable())
    disabled = asyncio.run(crash_detection_gap())
    assert disabled is not None and "disabled" in disabled
