"""How long each test took in a whole-suite run, and the slowest-first order of files it gives.

Under pytest-xdist with `--dist loadfile --no-loadscope-reorder` (the Makefile's
`PYTEST_ARGS`) whole files are handed to the workers in collection order: the longest
files start first and the quick ones fill in around them, instead of one worker running a
long file alone at the end. `tests/durations.json` holds each test's seconds (setup, call
and teardown, from the junit XML of a whole-suite run); a file's weight is the sum over its
tests that this run selected, so `make test-fast` orders its files by what it runs of
them. Files none of whose selected tests are recorded (new ones) are scheduled after the
known ones, in collection order. Only the order of files changes, never the order of tests
within a file.

`make durations` rewrites it from the junit XML that `make test` leaves behind:
`python -m tests.durations JUNIT_XML [OUT_JSON]`.
"""

from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Protocol, TypeVar

ROOT = Path(__file__).resolve().parents[1]
DURATIONS_FILE = ROOT / "tests" / "durations.json"


def nodeid_of(classname: str, name: str, root: Path = ROOT) -> str | None:
    """The pytest node id of a junit test case: `tests.cli.test_show` (or, for a test in a
    class, `tests.cli.test_show.TestShow`) and `test_x[sqlite]` give
    `tests/cli/test_show.py[::TestShow]::test_x[sqlite]`; None if no such file exists."""
    if not classname:  # a collection error's case: no test, no time
        return None
    parts = classname.split(".")
    for split in range(len(parts), 0, -1):
        path = Path(*parts[:split]).with_suffix(".py")
        if (root / path).is_file():
            return "::".join([path.as_posix(), *parts[split:], name])
    return None


def from_junit(xml: str, root: Path = ROOT) -> dict[str, float]:
    """Seconds per test (by node id, sorted) in a junit XML report (pytest's `--junitxml`,
    whose times include setup and teardown), for the tests whose file exists under `root`."""
    seconds: dict[str, float] = {}
    for case in ET.fromstring(xml).iter("testcase"):
        nodeid = nodeid_of(case.get("classname", ""), case.get("name", ""), root)
        if nodeid is not None:
            seconds[nodeid] = seconds.get(nodeid, 0.0) + float(case.get("time") or 0)
    return {nodeid: round(seconds[nodeid], 2) for nodeid in sorted(seconds)}


def load(path: Path = DURATIONS_FILE) -> dict[str, float]:
    """The recorded seconds per test; empty when there is no file yet."""
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return {}
    return {str(k): float(v) for k, v in data.items()}


class _Collected(Protocol):
    @property
    def nodeid(self) -> str: ...


ItemT = TypeVar("ItemT", bound=_Collected)


def slowest_first(items: Iterable[ItemT], seconds: Mapping[str, float]) -> list[ItemT]:
    """`items` grouped by file, the files by their recorded seconds among `items`, longest
    first, then the files with none recorded; a file's tests keep their order."""
    items = list(items)
    weight: dict[str, float] = {}
    for item in items:
        if item.nodeid in seconds:
            path = item.nodeid.partition("::")[0]
            weight[path] = weight.get(path, 0.0) + seconds[item.nodeid]

    def rank(item: ItemT) -> tuple[bool, float]:
        path = item.nodeid.partition("::")[0]
        return (path not in weight, -weight.get(path, 0.0))

    return sorted(items, key=rank)


def main(argv: list[str] | None = None) -> None:
    """`python -m tests.durations JUNIT_XML [OUT_JSON]`: write the seconds per test."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) not in (1, 2):
        raise SystemExit("usage: python -m tests.durations JUNIT_XML [OUT_JSON]")
    seconds = from_junit(Path(args[0]).read_text())
    if not seconds:
        raise SystemExit(f"{args[0]}: no test cases with a file under {ROOT}")
    out = Path(args[1]) if len(args) == 2 else DURATIONS_FILE
    out.write_text(json.dumps(seconds, indent=0) + "\n")
    files = {nodeid.partition("::")[0] for nodeid in seconds}
    print(f"{out}: {len(seconds)} tests in {len(files)} files, {sum(seconds.values()):.0f} s")


if __name__ == "__main__":
    main()
