"""The fast lane: which tests `make test-fast` (`pytest -m "not slow"`) runs.

The fast lane is every test that needs no Prefect server, no `epiflow` subprocess (each
one imports the CLI's stack anew: ~5 s on two loaded cores), no model server, no training
and no image build: what a developer runs after each change. PostgreSQL, the S3 server and
nsjail are in it. A test leaves it by carrying the `slow` mark, which it gets in one of two
ways:

1. **Found at collection** (`mark_out_of_lane`): the test's function, its fixtures, or the
   functions and classes of `tests` they call (followed through globals, module
   attributes, nested functions and imports inside a body) reference one of
   `OUT_OF_LANE`, the entry points that start those things. The test gets
   `slow(reason=...)` naming the entry point and the chain that reaches it; a new test that
   starts a Prefect server cannot land in the fast lane by forgetting a mark.
2. **By hand**, `@pytest.mark.slow(reason=...)`, for what the search cannot see: an image
   build or a long run reached only through project code, a load test.

The search reads names in compiled code; it does not run anything. It does not follow
project code outside `tests` (a flow that starts a server on its own, say), nor names
made at run time (`getattr`, `request.getfixturevalue`); those tests need the hand mark.
"""

from __future__ import annotations

import importlib
import inspect
import sys
import types
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import pytest

FOLLOWED_PACKAGE = "tests"
"""Functions and classes of this package are followed into; project code is not."""


@dataclass(frozen=True)
class EntryPoint:
    """A function, class or string whose use puts a test outside the fast lane."""

    module: str
    """The module defining it, as imported (`tests.cli.local`)."""
    name: str
    """Its name in that module."""
    reason: str
    """What using it needs, for the `slow` mark's reason."""

    def resolve(self) -> object | None:
        """The object. A module of `tests` is imported for it (a string is matched by value,
        so a test can use one without importing its module); any other only if some
        collected test imported it (else no test can reference it, and importing torch or
        Prefect for nothing would slow every collection): otherwise None."""
        if self.module.startswith(FOLLOWED_PACKAGE + "."):
            importlib.import_module(self.module)
        module = sys.modules.get(self.module)
        # The module's own dict: a lazy attribute (TRL's) is not imported by looking.
        return None if module is None else vars(module).get(self.name)


OUT_OF_LANE: tuple[EntryPoint, ...] = (
    EntryPoint(
        "prefect.testing.utilities",
        "prefect_test_harness",
        "starts Prefect's test harness server",
    ),
    EntryPoint("tests.services.prefect_server", "PrefectServer", "starts a `prefect server`"),
    EntryPoint(
        "orchestration.prefect_server",
        "attach",
        "starts or attaches to the shared local Prefect server",
    ),
    EntryPoint(
        "tests.cli.local",
        "local_prefect_home",
        "runs `epiflow` against a shared local Prefect server",
    ),
    EntryPoint(
        "tests.cli.local",
        "cli_env",
        "runs an `epiflow` subprocess scenario against a local Prefect server",
    ),
    EntryPoint("tests.cli.local", "EPIFLOW", "runs the `epiflow` command as a subprocess"),
    EntryPoint("agent.serving", "serve_checkpoint", "starts a `transformers serve` model server"),
    EntryPoint(
        "training.base_model", "build_base_model", "builds a base model (trains its tokenizer)"
    ),
    EntryPoint("training.trainers", "run_training", "trains a model"),
    EntryPoint("training.pipeline", "train_checkpoint", "trains a model"),
    EntryPoint("training.pipeline", "prepare_base_model", "trains a model (the base's warm-up)"),
    EntryPoint("trl", "SFTTrainer", "trains a model with TRL"),
)
"""The entry points of a Prefect server, a CLI subprocess, a model server and training, as
the tests reach them. A string (`EPIFLOW`, the path of the `epiflow` command) is matched by
value: the modules that spell the path themselves are found too. An image build has none
here: the tests reach it only through project code (a Harbor suite building its images on
first use), so they carry the mark by hand."""


class _Search:
    """Which entry point, if any, a piece of test code reaches (memoised per code object)."""

    def __init__(self, entry_points: Iterable[EntryPoint]) -> None:
        self.targets: dict[int, EntryPoint] = {}
        self.strings: dict[str, EntryPoint] = {}
        self.by_import: dict[tuple[str, str], EntryPoint] = {}
        for entry in entry_points:
            self.by_import[(entry.module, entry.name)] = entry
            target = entry.resolve()
            if isinstance(target, str):
                self.strings[target] = entry
            elif target is not None:
                self.targets[id(target)] = entry
        self.done: dict[types.CodeType, tuple[str, ...] | None] = {}

    def entry(self, obj: object) -> EntryPoint | None:
        """The entry point `obj` is (a string: one equal to it), if any."""
        if isinstance(obj, str):
            return self.strings.get(obj)
        return self.targets.get(id(obj))

    def reach(self, obj: object) -> tuple[str, ...] | None:
        """The chain of names from `obj` to an entry point, ending in its reason, or None."""
        entry = self.entry(obj)
        if entry is not None:
            return (entry.name, entry.reason)
        if isinstance(obj, type):
            if not obj.__module__.startswith(FOLLOWED_PACKAGE + "."):
                return None
            for name, member in vars(obj).items():
                if isinstance(member, staticmethod | classmethod):
                    member = member.__func__
                elif isinstance(member, property):
                    member = member.fget
                chain = self.reach(member) if callable(member) else None
                if chain is not None:
                    return (f"{obj.__name__}.{name}", *chain[1:])
            return None
        if not callable(obj):
            return None
        try:
            function = inspect.unwrap(obj)
        except ValueError:  # a `__wrapped__` cycle
            return None
        if not isinstance(function, types.FunctionType):
            return None
        if not function.__module__.startswith(FOLLOWED_PACKAGE + "."):
            return None
        chain = self._code(function.__code__, function.__globals__)
        return None if chain is None else (function.__name__, *chain)

    def _code(self, code: types.CodeType, globals_: Mapping[str, Any]) -> tuple[str, ...] | None:
        if code in self.done:
            return self.done[code]
        self.done[code] = None  # a recursive call is not found through itself
        found = self._search_code(code, globals_)
        self.done[code] = found
        return found

    def _search_code(
        self, code: types.CodeType, globals_: Mapping[str, Any]
    ) -> tuple[str, ...] | None:
        names = set(code.co_names)
        for (module, name), entry in self.by_import.items():
            if module in names and name in names:  # `from module import name` in the body
                return (entry.name, entry.reason)
        for name in code.co_names:
            if name not in globals_:
                continue
            value = globals_[name]
            if isinstance(value, types.ModuleType):  # `module.attribute`
                for attribute in names:
                    found = self.entry(getattr(value, attribute, None))
                    if found is not None:
                        return (found.name, found.reason)
                continue
            chain = self.reach(value)
            if chain is not None:
                return chain if chain[0] == name else (name, *chain[1:])
        for const in code.co_consts:
            if isinstance(const, types.CodeType):  # nested functions, lambdas, comprehensions
                chain = self._code(const, globals_)
                if chain is not None:
                    return chain
        return None


def out_of_lane_reason(
    function: Callable[..., object],
    fixtures: Mapping[str, Iterable[Callable[..., object]]],
    *,
    entry_points: Iterable[EntryPoint] = OUT_OF_LANE,
    search: _Search | None = None,
) -> str | None:
    """Why the test `function` with these fixture functions (by fixture name) is outside the
    fast lane, e.g. "fixture prefect_home → local_prefect_home: runs `epiflow` against a
    shared local Prefect server", or None when nothing it reaches is in `entry_points`."""
    search = search or _Search(entry_points)
    chain = search.reach(function)
    if chain is not None:
        return " → ".join(chain[1:-1]) + ": " + chain[-1]
    for fixture, functions in fixtures.items():
        for fixture_function in functions:
            chain = search.reach(fixture_function)
            if chain is not None:
                return " → ".join((f"fixture {fixture}", *chain[1:-1])) + ": " + chain[-1]
    return None


def mark_out_of_lane(items: Iterable[pytest.Item]) -> None:
    """Give each collected test that reaches an `OUT_OF_LANE` entry point the `slow` mark,
    with the reason."""
    search = _Search(OUT_OF_LANE)
    for item in items:
        if not isinstance(item, pytest.Function) or item.get_closest_marker("slow"):
            continue
        fixtures = {
            name: [definition.func for definition in definitions]
            for name, definitions in item._fixtureinfo.name2fixturedefs.items()
        }
        reason = out_of_lane_reason(item.obj, fixtures, search=search)
        if reason is not None:
            item.add_marker(pytest.mark.slow(reason=reason))
