"""How the suite is scheduled, with or without pytest-xdist (`make test` runs it on
workers: `-n`, `--dist loadgroup`, see the Makefile).

- A test that uses a module-scoped fixture (a Prefect server with `epiflow serve`, a
  model trained once, a populated database) is grouped with the other tests of its
  module that use one (`xdist_group`): the group runs on one worker, so the fixture is
  built once, not once per worker. Every other test is scheduled on its own.
- Tests marked `slow` (minutes: they train, or wait on real services and automations)
  run first, with their groups: on workers they then overlap with the many quick tests
  instead of starting last and running alone. Without xdist the order changes the same
  way; the tests of a group stay together, so no module fixture is built twice.
"""

from __future__ import annotations

import pytest

SLOW = "slow"


def module_group(item: pytest.Item) -> str | None:
    """The group of a test that uses a module-scoped fixture (directly or through another
    fixture): its module's node id; None for a test that needs none."""
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return None
    for defs in info.name2fixturedefs.values():
        if defs and defs[-1].scope == "module":
            return item.nodeid.split("::", 1)[0]
    return None


def schedule(items: list[pytest.Item], *, xdist_groups: bool) -> None:
    """Reorder `items` in place (slow units first, otherwise collection order) and, with
    `xdist_groups`, mark the tests that share a module fixture with their `xdist_group`."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        group = module_group(item)
        if group is not None and xdist_groups and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(group))
        units.setdefault(group or item.nodeid, []).append(item)
    ordered = sorted(
        units.values(), key=lambda unit: not any(i.get_closest_marker(SLOW) for i in unit)
    )
    items[:] = [item for unit in ordered for item in unit]
