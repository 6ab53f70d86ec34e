"""`epiflow --help`, `epiflow protocol parse` and `epiflow show` import nothing heavy they
do not use: each runs in a fresh interpreter (the real `epiflow` entry point, this
checkout's code via PYTHONPATH) and reports the heavy packages in `sys.modules` when it
exits. Their start-up time is measured by `bench/cli_start.py`, not here.

Beyond the heavy packages every command keeps out (`HEAVY`), each keeps out what it does
not use: `--help` lists every command without pydantic, the settings, SQL, YAML, asyncio
or the suites (typer's own help renderer imports rich); `protocol parse` runs without
typer or rich (`cli.app.FAST_PATHS`); `show` reads SQL without numpy, pyarrow or the
model clients."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from storage import migrate
from storage.db import make_engine
from storage.episodes import persist_episodes
from storage.objects import LocalObjectStore
from storage.settings import DatabaseSettings
from tests.storage.builders import make_trajectory

pytestmark = pytest.mark.slow(reason="runs the `epiflow` entry point in fresh interpreters")

ROOT = Path(__file__).resolve().parents[2]
HEAVY = ("prefect", "great_expectations", "polars", "torch", "transformers")
NOT_FOR_HELP = (
    *HEAVY,
    *("pydantic", "pydantic_settings", "config", "sqlalchemy", "sqlmodel", "alembic"),
    *("psycopg", "yaml", "asyncio", "suites", "storage", "httpx"),
)
NOT_FOR_PARSE = (
    *HEAVY,
    *("typer", "rich", "pydantic_settings", "config", "sqlalchemy", "yaml", "asyncio"),
    *("suites", "storage", "httpx"),
)
NOT_FOR_SHOW = (*HEAVY, "numpy", "pyarrow", "openai", "httpx", "datasets", "trl", "minio")

# Runs the console script's `main` and, however it exits, prints the heavy top-level
# packages it imported on stderr's last line.
_PROBE = """
import atexit, json, sys
heavy = sys.argv.pop(1).split(",")
atexit.register(lambda: print("HEAVY=" + json.dumps(sorted(
    {m.split(".")[0] for m in sys.modules} & set(heavy))), file=sys.stderr))
sys.argv[0] = "epiflow"
from cli.app import main
main()
"""


def _heavy_imported(
    args: list[str], env: dict[str, str], stdin: str = "", heavy: tuple[str, ...] = HEAVY
) -> list[str]:
    done = subprocess.run(
        [sys.executable, "-c", _PROBE, ",".join(heavy), *args],
        cwd=ROOT,
        env={**env, "PYTHONPATH": str(ROOT)},
        input=stdin,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    line = next(x for x in reversed(done.stderr.splitlines()) if x.startswith("HEAVY="))
    found: list[str] = json.loads(line.removeprefix("HEAVY="))
    return found


@pytest.mark.parametrize("args", [["--help"], ["protocol", "parse", "--help"], ["show", "--help"]])
def test_help_imports_nothing_heavy(args: list[str]) -> None:
    assert _heavy_imported(args, dict(os.environ)) == []


def test_top_level_help_imports_no_command_dependency() -> None:
    assert _heavy_imported(["--help"], dict(os.environ), heavy=NOT_FOR_HELP) == []


def test_protocol_parse_imports_nothing_heavy() -> None:
    message = '<tool_call id="c1" name="list_dir">\n<arg name="path">.</arg>\n</tool_call>'
    for args in (["protocol", "parse", "--json"], ["protocol", "parse"]):
        assert _heavy_imported(args, dict(os.environ), message, heavy=NOT_FOR_PARSE) == []


def test_show_imports_nothing_heavy(tmp_path: Path) -> None:
    url = f"sqlite:///{tmp_path / 'show.db'}"
    engine = make_engine(DatabaseSettings(url=url))
    migrate.upgrade(engine)
    store = LocalObjectStore(tmp_path / "objects")
    store.check()
    t = make_trajectory("imports-run", n_steps=3)
    persist_episodes(engine, store, [t])
    engine.dispose()
    env = {k: v for k, v in os.environ.items() if not k.startswith("EPIFLOW_")}
    env.update(EPIFLOW_DATABASE_URL=url, EPIFLOW_OBJECTS_URL=str(tmp_path / "objects"))
    assert _heavy_imported(["show", str(t.episode_id)], env, heavy=NOT_FOR_SHOW) == []
