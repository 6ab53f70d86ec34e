"""The stock OpenEnv client (`openenv-core`'s `GenericEnvClient`, unchanged) drives
`epiflow env serve`'s protocol: reset → the oracle's calls → done on every built-in
template, with the reward `epiflow suites check` gives the oracle (verifier score 1.0).

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
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from config.settings import load_settings
from scoring.rewards import final_reward
from suites.builtin import builtin_suite
from tests.environment.test_server import Served, _serve


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
