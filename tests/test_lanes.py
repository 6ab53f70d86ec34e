"""The fast lane's rule (`tests/lanes.py`) and the slowest-first order (`tests/durations.py`).

The rule is checked on code of this module: entry points and helpers defined here stand
for a Prefect server and the test helpers that reach one.
"""

from __future__ import annotations

import importlib
import json
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import durations, lanes


def starts_a_server() -> None:
    """Stands for an entry point such as `PrefectServer`."""


ENTRY = lanes.EntryPoint(__name__, "starts_a_server", "starts a server")


def _helper() -> None:
    starts_a_server()


class _Scenario:
    def run(self) -> None:
        _helper()


def _reason(function: Callable[..., object], **fixtures: Callable[..., object]) -> str | None:
    return lanes.out_of_lane_reason(
        function, {name: [f] for name, f in fixtures.items()}, entry_points=[ENTRY]
    )


def test_a_test_calling_an_entry_point_leaves_the_lane_naming_it() -> None:
    def test() -> None:
        starts_a_server()

    assert _reason(test) == "starts_a_server: starts a server"


def test_helpers_classes_and_nested_code_are_followed() -> None:
    def through_helper() -> None:
        _helper()

    def through_class() -> None:
        _Scenario().run()

    def through_nested_function() -> None:
        def inner() -> None:
            for _ in range(1):
                _helper()

        inner()

    assert _reason(through_helper) == "_helper → starts_a_server: starts a server"
    assert _reason(through_class) == "_Scenario → _helper → starts_a_server: starts a server"
    assert _reason(through_nested_function) == "_helper → starts_a_server: starts a server"


def test_a_fixture_reaching_an_entry_point_is_named() -> None:
    def server_fixture() -> None:
        _helper()

    def test(server: None) -> None:
        pass

    assert _reason(test, server=server_fixture) == (
        "fixture server → _helper → starts_a_server: starts a server"
    )


def test_code_that_reaches_no_entry_point_stays_in_the_lane() -> None:
    def test() -> None:
        assert json.loads("1") == 1

    assert _reason(test) is None
    assert lanes.out_of_lane_reason(test, {}) is None


def _imports_in_its_body() -> None:
    from tests.cli.local import cli_env

    cli_env(Path(), Path())


def _imports_the_module_in_its_body() -> None:
    import tests.cli.local as local

    local.cli_env(Path(), Path())


def _names_the_module_at_run_time() -> None:
    importlib.import_module("tests.cli.local").cli_env(Path(), Path())


EPIFLOW_HERE = str(Path(sys.executable).parent / "epiflow")
"""A module spelling the path of `epiflow` itself, not importing `EPIFLOW`."""


def _runs_epiflow() -> None:
    subprocess.run([EPIFLOW_HERE, "--help"], check=True)


PROBES = {
    f.__name__: f
    for f in (
        _imports_in_its_body,
        _imports_the_module_in_its_body,
        _names_the_module_at_run_time,
        _runs_epiflow,
    )
}
"""Code reaching the real entry points. The tests look them up here by name, which the
search does not follow, so that those tests themselves stay in the fast lane."""


def test_imports_inside_a_body_are_seen() -> None:
    for probe in ("_imports_in_its_body", "_imports_the_module_in_its_body"):
        reason = lanes.out_of_lane_reason(PROBES[probe], {})
        assert (reason or "").startswith("cli_env: "), probe
    # A name made at run time is not followed: the hand mark's case.
    assert lanes.out_of_lane_reason(PROBES["_names_the_module_at_run_time"], {}) is None


def test_a_string_entry_point_is_found_by_value() -> None:
    assert lanes.out_of_lane_reason(PROBES["_runs_epiflow"], {}) == (
        "EPIFLOW_HERE: runs the `epiflow` command as a subprocess"
    )


@pytest.mark.slow(reason="imports TRL's trainers, transformers and Prefect's test harness")
def test_every_entry_point_names_an_object_that_exists() -> None:
    """A renamed entry point would silently let its tests into the fast lane."""
    for entry in lanes.OUT_OF_LANE:
        module = importlib.import_module(entry.module)
        assert getattr(module, entry.name, None) is not None, entry


def test_no_test_of_this_run_on_a_prefect_server_is_in_the_lane(
    request: pytest.FixtureRequest,
) -> None:
    """The rule as this session's collection applied it: every collected test using a
    Prefect server fixture has the `slow` mark (in the fast lane: none is left)."""
    servers = {"prefect_harness", "prefect_api_url", "prefect_home"}
    unmarked = [
        item.nodeid
        for item in request.session.items
        if isinstance(item, pytest.Function)
        and servers & set(item.fixturenames)
        and not item.get_closest_marker("slow")
    ]
    assert unmarked == []


JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
  <testcase classname="tests.test_lanes" name="test_b[sqlite]" time="2.5" />
  <testcase classname="tests.test_lanes" name="test_a" time="1.25" />
  <testcase classname="tests.cli.test_show.TestShow" name="test_c" time="7" />
  <testcase classname="tests.gone.test_removed" name="test_d" time="9" />
  <testcase classname="" name="tests.test_broken" time="0.000"><error message="collection failure" /></testcase>
</testsuite></testsuites>
"""


def test_junit_gives_seconds_per_test_of_an_existing_file() -> None:
    assert durations.from_junit(JUNIT) == {
        "tests/cli/test_show.py::TestShow::test_c": 7.0,
        "tests/test_lanes.py::test_a": 1.25,
        "tests/test_lanes.py::test_b[sqlite]": 2.5,
    }


@dataclass
class _Item:
    nodeid: str


def test_files_go_longest_first_by_what_is_selected_then_unknown_ones_in_their_order() -> None:
    items = [
        _Item("tests/new_b.py::t"),
        _Item("tests/quick.py::t1"),
        _Item("tests/long.py::t1"),
        _Item("tests/new_a.py::t"),
        _Item("tests/quick.py::t2"),
        _Item("tests/long.py::t2"),
    ]
    seconds = {
        "tests/long.py::t1": 5.0,
        "tests/long.py::t2": 6.0,
        "tests/quick.py::t1": 0.0,
        "tests/quick.py::deselected": 900.0,  # not among the items: not counted
        "tests/fast_only.py::t": 1.0,
    }
    assert [i.nodeid for i in durations.slowest_first(items, seconds)] == [
        "tests/long.py::t1",
        "tests/long.py::t2",
        "tests/quick.py::t1",
        "tests/quick.py::t2",
        "tests/new_b.py::t",
        "tests/new_a.py::t",
    ]


def test_the_committed_durations_file_reads(tmp_path: Path) -> None:
    seconds = durations.load()
    assert seconds and all(s >= 0 and "::" in nodeid for nodeid, s in seconds.items())
    assert durations.load(tmp_path / "missing.json") == {}
