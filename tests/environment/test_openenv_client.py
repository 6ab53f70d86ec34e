"""The stock OpenEnv client (`openenv-core`'s `GenericEnvClient`, unchanged) drives
`epiflow env serve`'s protocol: reset → the oracle's calls → done on every built-in
template, with the reward `epiflow suites check` gives the oracle (verifier score 1.0),
and on both Harbor tasks of `../shared/interop/harbor-tasks/` (selected by name in the
reset), with the rewards of the scores the real `epiflow suites check --json` reports
for them.

The Harbor test needs root and mmdebstrap, and builds its images into the cache the
Harbor tests use (`tests/suites/test_harbor_tasks.py`'s `IMAGES`), so later runs reuse them.

openenv-core is not in the lock (its dependencies pull gradio and fastmcp). Its client
modules need only what is installed (websockets, pydantic), but the package's
`__init__` imports its server, which needs fastmcp; so the test loads `openenv` and
`openenv.core` as bare namespaces and imports the client modules as shipped. `make
install` installs it (`--no-deps`, the Makefile's OPENENV_SPEC) with the dev extra; the
test skips where it is not importable.
"""

from __future__ import annotations

import asyncio
import importlib
import importlib.util
import json
import os
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from config.settings import load_settings
from sandbox.settings import SandboxSettings
from scoring.rewards import final_reward
from suites.builtin import builtin_suite
from suites.registry import load_suite
from suites.settings import SuitesSettings
from tests.cli.local import EPIFLOW, sandbox_state_dir
from tests.environment.test_server import Served, _serve
from tests.suites.test_harbor_tasks import IMAGES, INTEROP, builds_images, needs_builder


def _generic_client() -> Any:
    spec = importlib.util.find_spec("openenv")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("openenv-core is not installed (pip install --no-deps openenv-core==0.3.0)")
    root = Path(next(iter(spec.submodule_search_locations)))
    saved = {k: v for k, v in sys.modules.items() if k == "openenv" or k.startswith("openenv.")}
    for name, path in (("openenv", root), ("openenv.core", root / "core")):
        package = types.ModuleType(name)
        package.__path__ = [str(path)]
        sys.modules[name] = package
    try:
        return importlib.import_module("openenv.core.generic_client").GenericEnvClient
    finally:
        for name in [k for k in sys.modules if k == "openenv" or k.startswith("openenv.")]:
            del sys.modules[name]
        sys.modules.update(saved)


TEMPLATES = sorted(builtin_suite().templates)


@pytest.fixture
def served_all(tmp_path: Path) -> Iterator[Served]:
    yield from _serve(tmp_path, token=None, max_sessions=2, idle_timeout_s=60.0, templates=None)


def test_the_stock_client_drives_every_builtin_template(served_all: Served) -> None:
    client_class = _generic_client()
    suite = builtin_suite()
    expected = final_reward(1.0, load_settings().rewards)

    async def one(template: str) -> float | None:
        task = suite.generate(template, 0)
        async with client_class(base_url=served_all.http) as env:
            result = await env.reset(template=template, instance_seed=0)
            assert result.observation["instruction"] == task.prompt
            for call in task.reference_solution:
                result = await env.step({"tool": call.tool, "arguments": call.args})
                assert result.done is False
            result = await env.step({"final": task.reference_final or ""})
            assert result.done is True, result.observation
            assert result.observation["verifier_score"] == 1.0, (template, result.observation)
            reward: float | None = result.reward
            return reward

    async def main() -> list[float | None]:
        return [await one(template) for template in TEMPLATES]

    rewards = asyncio.run(main())
    assert rewards == [expected] * len(TEMPLATES)
    with served_all.engine.connect() as conn:
        stored = conn.execute(text("SELECT template, final_reward, status FROM episode")).all()
    assert sorted(r[0] for r in stored) == TEMPLATES
    assert {(r[1], r[2]) for r in stored} == {(expected, "success")}


HARBOR_SUITE = INTEROP.name
HARBOR_TASKS = ["csv-filter", "hello-world"]


@pytest.fixture
def harbor_settings(monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """The interop dataset on the suites path, its images in the Harbor tests' cache."""
    IMAGES.mkdir(exist_ok=True)
    IMAGES.chmod(0o755)
    harbor = {
        "EPIFLOW_SUITES_PATH": str(INTEROP),
        "EPIFLOW_SUITES_HARBOR_IMAGE_DIR": str(IMAGES),
    }
    for name, value in harbor.items():
        monkeypatch.setenv(name, value)
    return harbor


def _suites_check_scores(harbor: dict[str, str], state: Path) -> dict[str, float]:
    """What the real `epiflow suites check --json` scores the oracle on each Harbor task."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EPIFLOW_", "PREFECT_API"))}
    env.update(harbor, PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    env["EPIFLOW_SANDBOX_STATE_DIR"] = str(state)
    done = subprocess.run(
        [EPIFLOW, "suites", "check", "--suite", HARBOR_SUITE, "--instances", "1", "--json"],
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout)
    return {t["template"]: t["mean_score"] for t in report["templates"]}


@pytest.fixture
def served_harbor(harbor_settings: dict[str, str], tmp_path: Path) -> Iterator[Served]:
    yield from _serve(
        tmp_path, token=None, suite=HARBOR_SUITE, templates=None, max_sessions=2,
        idle_timeout_s=300.0,
    )  # fmt: skip


@needs_builder
@builds_images
def test_the_stock_client_drives_both_harbor_tasks(
    harbor_settings: dict[str, str], served_harbor: Served
) -> None:
    client_class = _generic_client()
    suite = load_suite(HARBOR_SUITE, settings=SuitesSettings(), sandbox=SandboxSettings())
    assert sorted(suite.templates) == HARBOR_TASKS
    rewards = load_settings().rewards
    with sandbox_state_dir() as state:
        expected = {
            name: final_reward(score, rewards)
            for name, score in _suites_check_scores(harbor_settings, state).items()
        }
    assert sorted(expected) == HARBOR_TASKS

    async def one(name: str) -> float | None:
        task = suite.generate(name, 0)
        assert task.reference_solution, name
        async with client_class(base_url=served_harbor.http, message_timeout_s=600.0) as env:
            result = await env.reset(template=name)  # a Harbor task, by name
            assert result.observation["instruction"] == task.prompt
            assert result.observation["task_id"] == task.task_id
            for call in task.reference_solution:
                result = await env.step({"tool": call.tool, "arguments": call.args})
                assert result.done is False, result.observation
                assert result.observation["exit_code"] == 0, (name, result.observation)
            result = await env.step({"final": task.reference_final or ""})
            assert result.done is True, result.observation
            assert result.observation["status"] == "success", (name, result.observation)
            reward: float | None = result.reward
            return reward

    async def main() -> dict[str, float | None]:
        return {name: await one(name) for name in HARBOR_TASKS}

    assert asyncio.run(main()) == expected
    with served_harbor.engine.connect() as conn:
        stored = conn.execute(
            text("SELECT template, final_reward, status FROM episode ORDER BY template")
        ).all()
        harbor = conn.execute(
            text(
                "SELECT task_name, tests_passed, tests_total FROM harbor_episode ORDER BY task_name"
            )
        ).all()
    assert [tuple(r) for r in stored] == [(n, expected[n], "success") for n in HARBOR_TASKS]
    # The Harbor verifier (tests/test.sh in its own jail) judged each session.
    assert [r[0] for r in harbor] == HARBOR_TASKS
    assert all(0 < r[1] == r[2] for r in harbor), harbor
